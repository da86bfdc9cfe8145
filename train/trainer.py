"""One training loop for every task: AdamW + schedule, accumulation, clipping, mixed precision,
periodic evaluation with a best checkpoint, exact resume, TensorBoard, and DDP under torchrun.

Exact resume: the batch order of epoch e is a pure function of (seed, e), so a resumed run
skips the optimizer steps already done in the epoch and restores model, optimizer, scheduler,
scaler and RNG states; it then follows the uninterrupted run step for step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .distill import distilled_loss
from .features import Task
from .schedules import get_schedule
from .train_utils import (
    dataset_lengths,
    distributed,
    epoch_batches,
    freeze_embeddings,
    greater_is_better,
    make_optimizer,
    release_freed_memory,
    to_device,
)

log = logging.getLogger(__name__)
STATE_FILE = "train_state.pt"


def cpu_has_fast_bf16(flags: set[str] | None = None) -> bool:
    """bf16 autocast pays only with native bf16 matmuls (AVX512-BF16 or AMX). On an AVX2-only CPU
    a MiniLM training step measured 16.5x slower in bf16 than in fp32."""
    from export.int8_precision import cpu_flags

    return bool({"avx512_bf16", "amx_bf16"} & (cpu_flags() if flags is None else flags))


@dataclass
class TrainConfig:
    epochs: float = 3.0
    max_steps: int = 0  # > 0 overrides epochs
    batch_size: int = 32
    eval_batch_size: int = 64
    grad_accum: int = 1
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.0
    warmup_steps: int = 0
    schedule: str = "linear"
    grad_clip: float = 1.0
    precision: str = "fp32"
    seed: int = 42
    eval_every: int = 0  # steps; 0 = every epoch
    save_every: int = 0  # steps; 0 = at evaluations only
    log_every: int = 50
    metric_for_best: str = "accuracy"
    bucket: bool = True
    freeze_embeddings: bool = False
    distill_weight: float = 0.5  # with soft labels (--soft-labels): the teacher's share of the loss
    token_dropout: float = 0.0  # each real input token becomes [MASK] with this probability in training
    stop_after_steps: int = 0  # stop (resumably) after this many steps in this run
    max_minutes: float = 0.0  # wall-clock budget of this run: then end as if max_steps were reached
    progress: bool = True
    trim_memory: bool = True  # CPU: malloc_trim after every step (train_utils.release_freed_memory)
    loader_workers: int = 0  # processes that collate the coming steps' batches (0: in the loop)


# ----------------------------------------------------------------------------- trainer


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        task: Task,
        train_data,
        eval_data,
        config: TrainConfig,
        out_dir: str | Path,
        log_dir: str | Path | None = None,
        command: str = "",
    ):
        self.config, self.task = config, task
        self.train_data, self.eval_data = train_data, eval_data
        self.out_dir, self.command = Path(out_dir), command
        self.rank, self.world, local_rank = distributed()
        self.main = self.rank == 0
        if torch.cuda.is_available():
            self.device = torch.device("cuda", local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.setup_precision()
        if config.freeze_embeddings:
            log.info("froze %d embedding parameters", freeze_embeddings(model))
        self.model = model.to(self.device)
        self.wrapped = self.model
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.wrapped = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)

        self.lengths = dataset_lengths(train_data)
        n_batches = math.ceil(len(train_data) / config.batch_size) // self.world
        if n_batches == 0:
            raise ValueError(
                f"{len(train_data)} training features make no batch of {config.batch_size} "
                f"on each of {self.world} processes"
            )
        self.steps_per_epoch = math.ceil(n_batches / config.grad_accum)
        self.total_steps = config.max_steps or max(1, math.ceil(config.epochs * self.steps_per_epoch))
        warmup = config.warmup_steps or int(config.warmup_ratio * self.total_steps)
        self.optimizer = make_optimizer(self.model, config.lr, config.weight_decay)
        extra = {"d_model": model.config.hidden_size} if config.schedule == "noam" else {}
        self.scheduler = get_schedule(config.schedule, self.optimizer, warmup, self.total_steps, **extra)
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.precision == "fp16")
        self.step, self.epoch, self.step_in_epoch = 0, 0, 0
        self.best: dict[str, Any] = {}
        self.last_eval: dict[str, float] = {}
        self.last_eval_step = -1
        self.stop_requested = False
        self.stopped_by = ""  # why training ended: "steps", "time budget" or "" (interrupted)
        self.writer = self.make_writer(log_dir) if self.main else None

    # ------------------------------------------------------------------ setup

    def setup_precision(self) -> None:
        precision = self.config.precision
        if precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
        if precision == "fp16" and self.device.type != "cuda":
            raise ValueError("fp16 needs a CUDA GPU (it relies on loss scaling); use --precision bf16 on CPU")
        if precision == "bf16" and self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError("this GPU does not support bf16; use --precision fp16")
        if precision == "bf16" and self.device.type == "cpu" and not cpu_has_fast_bf16():
            log.warning(
                "bf16 on a CPU without native bf16 matmuls (AVX512-BF16 or AMX) is emulated and slower"
            )
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=dtype)) if dtype else nullcontext

    def make_writer(self, log_dir):
        if log_dir is None:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("tensorboard is not installed; no TensorBoard logs")
            return None
        return SummaryWriter(str(log_dir))

    def scalar(self, tag: str, value: float) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag, value, self.step)

    # ------------------------------------------------------------------ training

    def batches_for_epoch(self, epoch: int) -> list[list[np.ndarray]]:
        """This process's optimizer steps (groups of grad_accum micro-batches) for `epoch`."""
        c = self.config
        batches = epoch_batches(self.lengths, len(self.train_data), c.batch_size, c.seed, epoch, c.bucket)
        per_rank = len(batches) // self.world  # equal counts, or DDP would hang on the tail
        mine = batches[self.rank :: self.world][:per_rank]
        return [mine[i : i + c.grad_accum] for i in range(0, len(mine), c.grad_accum)]

    def collated_steps(self, groups: list[list[np.ndarray]]):
        """The micro-batches of each step from step_in_epoch on, collated in the loop or, with
        loader_workers, ahead in worker processes. Either way the same batches: a feature depends on
        (seed, epoch, index) alone, and the workers copy the dataset after set_epoch."""
        steps = _CollatedSteps(self.task, self.train_data, groups[self.step_in_epoch :])
        if not self.config.loader_workers:
            return (steps[k] for k in range(len(steps)))
        return iter(
            torch.utils.data.DataLoader(
                steps,
                batch_size=None,  # an item is already one step's micro-batches
                num_workers=self.config.loader_workers,
                prefetch_factor=4,
                pin_memory=self.device.type == "cuda",
                generator=torch.Generator(),  # the workers' seeds: not drawn from dropout's generator
            )
        )

    def train_step(self, micro_batches: list[dict[str, Any]]) -> dict[str, float]:
        self.wrapped.train()
        stats: dict[str, float] = {}
        for k, host in enumerate(micro_batches):
            batch = to_device(host, self.device)
            if self.config.token_dropout:
                batch["input_ids"] = self.drop_tokens(batch["input_ids"])
            sync = k == len(micro_batches) - 1 or self.world == 1
            teacher = batch.pop("teacher_logits", None)  # soft labels: not a model input
            labels = batch.pop("labels") if teacher is not None else None  # may hold IGNORE
            with nullcontext() if sync else self.wrapped.no_sync(), self.autocast():
                output = self.wrapped(**batch)
                if teacher is None:
                    loss = output.loss
                else:  # the labels were kept out of the model: it computes no loss of its own
                    loss = distilled_loss(output.logits, labels, teacher, self.config.distill_weight)
                loss = loss / len(micro_batches)
            self.scaler.scale(loss).backward()
            stats["loss"] = stats.get("loss", 0.0) + float(loss.detach())
            for name, value in self.task.step_stats(output, batch, len(micro_batches)).items():
                stats[name] = stats.get(name, 0.0) + value
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            params = [p for p in self.model.parameters() if p.requires_grad]
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        if self.config.trim_memory and self.device.type == "cpu":
            release_freed_memory()
        return stats

    def drop_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Input noise against memorising a few telling tokens: each token that is not padding or a
        special becomes [MASK] with probability token_dropout (drawn from torch's RNG, which resume
        restores)."""
        t = self.task.tokenizer
        fixed = (ids == t.pad_id) | (ids == t.cls_id) | (ids == t.sep_id)
        drop = (torch.rand(ids.shape, device=ids.device) < self.config.token_dropout) & ~fixed
        return ids.masked_fill(drop, t.mask_id)

    def train(self) -> dict[str, Any]:
        c = self.config
        started = time.time()
        losses: list[float] = []
        stop_at = self.step + c.stop_after_steps if c.stop_after_steps else None
        # Signal handlers can only be installed from the main thread.
        handle = self.main and threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, self.request_stop) if handle else None
        progress = self.progress_bar()
        last_log, last_log_step = time.time(), self.step
        try:
            while self.step < self.total_steps and not self.stop_requested:
                if hasattr(self.train_data, "set_epoch"):
                    self.train_data.set_epoch(self.epoch)
                groups = self.batches_for_epoch(self.epoch)
                steps = self.collated_steps(groups)
                while self.step_in_epoch < len(groups) and self.step < self.total_steps:
                    stats = self.train_step(next(steps))
                    self.step += 1
                    self.step_in_epoch += 1
                    losses.append(stats["loss"])
                    if progress is not None:
                        progress.update(1)
                        progress.set_postfix(
                            loss=f"{np.mean(losses[-50:]):.4f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}"
                        )
                    if self.step % c.log_every == 0 or self.step == 1:
                        self.log_train(stats, losses, (time.time() - last_log) / (self.step - last_log_step))
                        last_log, last_log_step = time.time(), self.step
                    epoch_done = self.step_in_epoch == len(groups)
                    if (c.eval_every and self.step % c.eval_every == 0) or (not c.eval_every and epoch_done):
                        self.evaluate_and_keep_best()
                        self.save_state()
                    elif c.save_every and self.step % c.save_every == 0:
                        self.save_state()
                    if (stop_at is not None and self.step >= stop_at) or self.stop_requested:
                        self.stop_requested = True
                        break
                    if self.over_budget(started):
                        break
                if self.step_in_epoch >= len(groups):
                    self.epoch, self.step_in_epoch = self.epoch + 1, 0
                if self.stopped_by:
                    break
        except KeyboardInterrupt:
            log.warning("interrupted at step %d; saving a resumable state", self.step)
            self.stop_requested = True
        finally:
            if progress is not None:
                progress.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        finished = not self.stop_requested
        if finished and not self.stopped_by:
            self.stopped_by = "steps"
        if finished and self.last_eval_step != self.step:
            self.evaluate_and_keep_best()
        self.save_state()
        summary = self.summary(time.time() - started, losses, finished)
        if self.main and finished:
            (self.out_dir / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        if self.writer is not None:
            self.writer.flush()
        if not finished:
            log.warning("stopped at step %d of %d; continue with --resume", self.step, self.total_steps)
        return summary

    def over_budget(self, started: float) -> bool:
        """True once this run has used its --max-minutes (every process agrees, so DDP stays in step)."""
        if not self.config.max_minutes:
            return False
        over = torch.tensor(float(time.time() - started >= 60 * self.config.max_minutes))
        if self.world > 1:
            dist.all_reduce(over, op=dist.ReduceOp.MAX)
        if over.item():
            log.info("time budget of %g minutes reached at step %d", self.config.max_minutes, self.step)
            self.stopped_by = "time budget"
        return bool(over.item())

    def request_stop(self, signum, frame) -> None:
        log.warning("SIGTERM: stopping after this step and saving a resumable state")
        self.stop_requested = True

    def progress_bar(self):
        if not (self.main and self.config.progress):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.total_steps, initial=self.step, desc="train", dynamic_ncols=True)

    def log_train(self, stats: dict[str, float], losses: list[float], seconds_per_step: float) -> None:
        if not self.main:
            return
        lr = self.scheduler.get_last_lr()[0]
        self.scalar("train/loss", stats["loss"])
        self.scalar("train/lr", lr)
        if "grad_norm" in stats:
            self.scalar("train/grad_norm", stats["grad_norm"])
        for name, value in self.task.step_scalars(stats).items():
            self.scalar(f"train/{name}", value)
        log.info(
            "step %d/%d epoch %d loss %.4f lr %.3g (%.2f s/step)",
            self.step,
            self.total_steps,
            self.epoch,
            float(np.mean(losses[-self.config.log_every :])),
            lr,
            seconds_per_step,
        )

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, data=None) -> dict[str, float]:
        """Metrics on `data` (default: the validation set), computed on the main process."""
        data = self.eval_data if data is None else data
        if data is None or len(data) == 0:
            return {}
        if hasattr(data, "set_epoch"):
            data.set_epoch(0)
        self.model.eval()
        lengths = dataset_lengths(data)
        order = np.argsort(lengths, kind="stable") if lengths is not None else np.arange(len(data))
        outputs: list[Any] = [None] * len(data)
        loss_sum, rows = 0.0, 0
        size = self.config.eval_batch_size
        for start in range(0, len(order), size):
            indices = order[start : start + size]
            host = collate_rows(self.task, data, indices)
            with self.autocast():
                output = self.model(**to_device(host, self.device))
            if output.loss is not None:
                loss_sum += float(output.loss) * len(indices)
                rows += len(indices)
            for i, row in zip(indices, self.task.row_outputs(output, host), strict=True):
                outputs[int(i)] = row
        metrics = self.task.metrics(data, outputs)
        if rows:
            metrics["loss"] = loss_sum / rows
        return {k: float(v) for k, v in metrics.items()}

    def evaluate_and_keep_best(self) -> None:
        self.last_eval_step = self.step
        metrics = self.evaluate() if self.main else {}
        if self.main and metrics:
            self.last_eval = metrics
            for name, value in metrics.items():
                self.scalar(f"eval/{name}", value)
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            log.info("eval at step %d: %s", self.step, shown)
            name = self.config.metric_for_best
            if name not in metrics:
                raise ValueError(f"--metric-for-best {name!r} is not among the metrics {sorted(metrics)}")
            value = metrics[name]
            best = self.best.get("value")
            better = best is None or (value > best if greater_is_better(name) else value < best)
            if better:
                self.best = {"metric": name, "value": value, "step": self.step, "metrics": metrics}
                self.model.save_pretrained(self.out_dir / "best")
                log.info("new best %s %.4f at step %d -> %s", name, value, self.step, self.out_dir / "best")
        if self.world > 1:
            dist.barrier()

    # ------------------------------------------------------------------ state

    def save_state(self) -> None:
        if not self.main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(self.out_dir)
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "total_steps": self.total_steps,
            "world_size": self.world,
            "best": self.best,
            "last_eval": self.last_eval,
            "last_eval_step": self.last_eval_step,
            "config": asdict(self.config),
            "rng_torch": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "rng_python": random.getstate(),
            "rng_numpy": [
                np.random.get_state()[0],
                np.random.get_state()[1].tolist(),
                *np.random.get_state()[2:],
            ],
        }
        tmp = self.out_dir / (STATE_FILE + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.out_dir / STATE_FILE)

    def load_state(self, directory: str | Path) -> None:
        path = Path(directory) / STATE_FILE
        if not path.exists():
            raise FileNotFoundError(f"cannot resume: no {STATE_FILE} in {directory}")
        state = torch.load(path, map_location="cpu", weights_only=True)
        for key in ("batch_size", "grad_accum", "seed", "schedule", "lr"):
            if state["config"].get(key) != getattr(self.config, key):
                log.warning(
                    "resuming with %s=%s but the run used %s; the run will not replay exactly",
                    key,
                    getattr(self.config, key),
                    state["config"].get(key),
                )
        if state["world_size"] != self.world:
            log.warning("resuming on %d processes, the run used %d", self.world, state["world_size"])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.step_in_epoch = state["step"], state["epoch"], state["step_in_epoch"]
        self.best, self.last_eval = state["best"], state["last_eval"]
        self.last_eval_step = state["last_eval_step"]
        torch.set_rng_state(state["rng_torch"])
        if torch.cuda.is_available() and state["rng_cuda"]:
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        random.setstate(state["rng_python"])
        name, keys, *rest = state["rng_numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
        log.info("resumed from %s at step %d (epoch %d)", path, self.step, self.epoch)

    def summary(self, seconds: float, losses: list[float], finished: bool) -> dict[str, Any]:
        return {
            "task": self.task.name,
            "finished": finished,
            "stopped_by": self.stopped_by,
            "steps": self.step,
            "total_steps": self.total_steps,
            "epochs": self.step / self.steps_per_epoch,
            "train_loss": float(np.mean(losses[-100:])) if losses else None,
            "validation": self.last_eval,
            "best": self.best,
            "wall_time_s": seconds,
            "steps_per_s": len(losses) / seconds if seconds > 0 else None,
            "train_features": len(self.train_data),
            "eval_features": len(self.eval_data) if self.eval_data is not None else 0,
            "world_size": self.world,
            "command": self.command,
        }


class _CollatedSteps(torch.utils.data.Dataset):
    """Step k's micro-batches, collated: what a DataLoader's workers build ahead of the loop."""

    def __init__(self, task: Task, data, groups: list[list[np.ndarray]]):
        self.task, self.data, self.groups = task, data, groups

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, k: int) -> list[dict[str, Any]]:
        return [collate_rows(self.task, self.data, indices) for indices in self.groups[k]]


def collate_rows(task: Task, data, indices: np.ndarray) -> dict[str, Any]:
    """The batch of features `indices` of `data`, as the task pads them."""
    return task.collate([data[int(i)] for i in indices])
