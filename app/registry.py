"""Bundles under MODELS_DIR: discovery, one per task, verified loading, warm-up, readiness."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from export.bundle import (
    MANIFEST_NAME,
    BundleError,
    BundleManifest,
    batch_invariant,
    load_bundle_manifest,
    verify_bundle_files,
)
from export.invariance import batch_invariance
from processing.padding import pad_batch, pad_choices
from processing.tokenizer import TextTokenizer

from .batcher import Batcher
from .errors import ApiError
from .metrics import Metrics
from .runtime import (
    RuntimeConfigError,
    RuntimePool,
    SessionTuning,
    available_providers,
    choose_variant,
    create_runtime,
    resolve_batch_tokens,
    resolve_device,
    resolve_instances,
    resolve_padding_factor,
    session_threads,
)
from .settings import TASK_NAMES, Settings, available_cores

log = logging.getLogger("app.registry")


class ConfigError(RuntimeError):
    """MODELS_DIR / DEFAULT_BUNDLES / DEVICE cannot be served as configured: refuse to start."""


@dataclass
class Bundle:
    name: str
    path: Path
    manifest: BundleManifest | None = None
    status: str = "pending"  # pending | loading | ready | failed | ignored
    error: str | None = None
    variant: str | None = None
    device: str | None = None
    threads: int | None = None
    tokenizer: TextTokenizer | None = None
    runtime: RuntimePool | None = None
    batcher: Batcher | None = None
    service: Any = None
    load_seconds: float | None = None

    @property
    def task(self) -> str | None:
        return self.manifest.task if self.manifest else None

    def matches(self, name: str) -> bool:
        return name in (self.name, self.manifest.name if self.manifest else None)


def collate_for(task: str, pad_id: int) -> Callable[[list[Any]], dict[str, np.ndarray]]:
    if task == "multiple-choice":
        return lambda groups: pad_choices(groups, pad_id)
    return lambda encodings: pad_batch(encodings, pad_id)


class Registry:
    def __init__(
        self, settings: Settings, metrics: Metrics, service_factory: Callable[[Bundle, Settings], Any]
    ):
        self.settings = settings
        self.metrics = metrics
        self.service_factory = service_factory
        self.bundles: list[Bundle] = []
        self.by_task: dict[str, Bundle] = {}
        self.device: str | None = None
        self.load_finished = False

    # ------------------------------------------------------------------ discovery

    def discover(self) -> None:
        models_dir = Path(self.settings.models_dir)
        if not models_dir.is_dir():
            raise ConfigError(f"MODELS_DIR {models_dir} is not a directory")
        for sub in sorted(p for p in models_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if not (sub / MANIFEST_NAME).exists():
                log.warning("skipping directory without bundle.json", extra={"path": str(sub)})
                continue
            bundle = Bundle(name=sub.name, path=sub)
            try:
                bundle.manifest = load_bundle_manifest(sub)
            except BundleError as e:
                self._fail(bundle, f"unreadable manifest: {e}")
            self.bundles.append(bundle)
        if not self.bundles:
            raise ConfigError(
                f"MODELS_DIR {models_dir} holds no bundles (sub-directories with {MANIFEST_NAME})"
            )
        self._select(self.settings.default_bundle_map)
        try:
            self.device = resolve_device(self.settings.device, available_providers())
        except RuntimeConfigError as e:
            raise ConfigError(str(e)) from e
        log.info(
            "bundles discovered",
            extra={
                "device": self.device,
                "serving": {t: b.name for t, b in self.by_task.items()},
                "ignored": [b.name for b in self.bundles if b.status == "ignored"],
            },
        )

    def _select(self, defaults: dict[str, str]) -> None:
        for task in TASK_NAMES:
            candidates = [b for b in self.bundles if b.task == task]
            wanted = defaults.get(task)
            if wanted is not None:
                chosen = [b for b in candidates if b.matches(wanted)]
                if not chosen:
                    raise ConfigError(
                        f"DEFAULT_BUNDLES names {wanted!r} for {task}, but the {task} bundles in "
                        f"MODELS_DIR are {[b.name for b in candidates] or 'none'}"
                    )
                selected = chosen[0]
            elif len(candidates) > 1:
                raise ConfigError(
                    f"MODELS_DIR has {len(candidates)} {task} bundles "
                    f"({', '.join(b.name for b in candidates)}); "
                    f"serve one by setting DEFAULT_BUNDLES={task}=<name>"
                )
            elif candidates:
                selected = candidates[0]
            else:
                continue
            self.by_task[task] = selected
            for other in candidates:
                if other is not selected:
                    other.status = "ignored"
                    other.error = f"not the DEFAULT_BUNDLES choice for {task}"

    @property
    def selected(self) -> list[Bundle]:
        return list(self.by_task.values())

    # ------------------------------------------------------------------ loading

    async def load_all(self) -> None:
        """Load, verify and warm every selected bundle; a failure only takes that bundle out."""
        selected = self.selected
        cores = available_cores()
        assert self.device is not None
        instances = resolve_instances(self.settings.model_instances, self.device, len(selected), cores)
        sessions = len(selected) * instances
        threads = session_threads(self.settings.intra_op_threads, sessions, cores)
        spinning = {"on": True, "off": False}.get(self.settings.ort_spinning, sessions == 1)
        for bundle in selected:
            bundle.status = "loading"
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self._load, bundle, threads, instances, spinning)
                assert bundle.runtime is not None and bundle.task is not None and bundle.tokenizer is not None
                bundle.batcher = Batcher(
                    bundle.runtime,
                    collate_for(bundle.task, bundle.tokenizer.pad_id),
                    max_batch_size=self.settings.max_batch_size,
                    max_batch_tokens=resolve_batch_tokens(self.settings.max_batch_tokens, self.device),
                    max_wait_ms=self.settings.max_wait_ms,
                    max_queue=self.settings.max_queue,
                    max_padding_factor=resolve_padding_factor(self.settings.max_padding_factor, self.device),
                    observer=self.metrics.observer(bundle.task),
                    name=bundle.name,
                    concurrency=instances,
                    inline_tokens=self.settings.inline_batch_tokens if self.device == "cpu" else 0,
                )
                bundle.batcher.start()
                bundle.service = self.service_factory(bundle, self.settings)
            except Exception as e:  # noqa: BLE001 - any load failure keeps this bundle out of service
                self._fail(bundle, str(e) or type(e).__name__)
                continue
            bundle.load_seconds = round(time.perf_counter() - started, 3)
            bundle.status = "ready"
            self.metrics.model_ready.labels(task=bundle.task, bundle=bundle.name).set(1)
            log.info(
                "bundle ready",
                extra={
                    "bundle": bundle.name,
                    "task": bundle.task,
                    "variant": bundle.variant,
                    "provider": bundle.runtime.provider if bundle.runtime else None,
                    "threads": threads,
                    "instances": instances,
                    "load_seconds": bundle.load_seconds,
                },
            )
        self.load_finished = True

    def _load(self, bundle: Bundle, threads: int, instances: int, spinning: bool) -> None:
        manifest = bundle.manifest
        assert manifest is not None and self.device is not None
        bundle.device = self.device
        bundle.variant = choose_variant(self.device, manifest.variants, self.settings.cpu_variant)
        # Hashes first: a tampered or truncated file must never reach onnxruntime.
        verify_bundle_files(bundle.path, manifest, bundle.variant)
        bundle.tokenizer = TextTokenizer.from_dir(bundle.path)
        bundle.threads = threads
        tuning = SessionTuning(
            spinning=spinning,
            mem_pattern=self.settings.ort_mem_pattern,
            cpu_arena=self.settings.ort_cpu_arena,
            # Shrinking applies to the arena only: without one ORT refuses the run option.
            arena_shrinkage=self.settings.ort_arena_shrinkage and self.settings.ort_cpu_arena,
            shrink_above_tokens=self.settings.ort_shrink_above_tokens,
        )
        path = manifest.variant_path(bundle.path, bundle.variant)
        disabled = manifest.variants[bundle.variant].disabled_optimizers
        bundle.runtime = RuntimePool(
            [
                create_runtime(path, self.device, threads, tuning, disabled_optimizers=disabled)
                for _ in range(instances)
            ]
        )
        self._warm_up(bundle)

    def _warm_up(self, bundle: Bundle) -> None:
        """Run a short and a full-length batch, and check the outputs against the manifest."""
        manifest, tokenizer, runtime = bundle.manifest, bundle.tokenizer, bundle.runtime
        assert manifest is not None and tokenizer is not None and runtime is not None
        short = tokenizer.encode("warm up", max_length=manifest.max_seq_len)
        longest = tokenizer.encode("warm up " * manifest.max_seq_len, max_length=manifest.max_seq_len)
        collate = collate_for(manifest.task, tokenizer.pad_id)
        rows = min(4, self.settings.max_batch_size)
        for batch in ([short], [longest] * rows):
            payloads: list[Any] = [[e, e] for e in batch] if manifest.task == "multiple-choice" else batch
            outputs = runtime.run(collate(payloads))
            missing = set(manifest.output_names) - set(outputs)
            if missing:
                raise BundleError(f"model outputs lack {sorted(missing)} listed in {MANIFEST_NAME}")
            if manifest.task in ("classify", "ner") and manifest.problem_type != "regression":
                n_labels = outputs["logits"].shape[-1]
                if n_labels != len(manifest.labels or []):
                    raise BundleError(
                        f"model emits {n_labels} labels but {MANIFEST_NAME} lists "
                        f"{len(manifest.labels or [])}"
                    )
            if not all(np.isfinite(v).all() for v in outputs.values()):
                raise BundleError("warm-up produced NaN or infinite outputs")
        if bundle.variant and batch_invariant(bundle.variant, bundle.device):
            # The promise /models makes, checked on this machine's kernels: the short input alone
            # against the same input padded next to the longest one.
            pair: list[Any] = [short, longest]
            if manifest.task == "multiple-choice":
                pair = [[e, e] for e in pair]
            report = batch_invariance(manifest.task, runtime.run, [collate(pair)])
            if not report["invariant"]:
                raise BundleError(
                    f"variant {bundle.variant} should give a row the same outputs alone and in a batch, "
                    f"but they differ by {report['max_abs_diff']:.3g} on this machine; set CPU_VARIANT=fused"
                )

    def _fail(self, bundle: Bundle, error: str) -> None:
        bundle.status, bundle.error = "failed", error
        log.error(
            "bundle failed to load and will not be served",
            extra={"bundle": bundle.name, "path": str(bundle.path), "task": bundle.task, "error": error},
        )

    # ------------------------------------------------------------------ serving

    def service(self, task: str) -> Any:
        bundle = self.by_task.get(task)
        if bundle is None:
            served = sorted(self.by_task) or ["none"]
            raise ApiError(
                404,
                "no_model",
                f"no {task} bundle is configured (MODELS_DIR serves: {', '.join(served)})",
            )
        if bundle.status == "failed":
            raise ApiError(
                503,
                "model_unavailable",
                f"the {task} bundle {bundle.name!r} failed to load and is not served; "
                "see /models and the logs",
            )
        if bundle.status != "ready" or bundle.service is None:
            raise ApiError(
                503,
                "model_loading",
                f"the {task} bundle {bundle.name!r} is still loading",
                headers={"Retry-After": "1"},
            )
        return bundle.service

    def readiness(self) -> tuple[bool, str, dict[str, str], dict[str, str]]:
        statuses = {b.name: b.status for b in self.bundles}
        errors = {b.name: b.error for b in self.bundles if b.status == "failed" and b.error}
        if any(b.status == "failed" for b in self.bundles):
            return False, "failed", statuses, errors
        if not self.load_finished or any(b.status != "ready" for b in self.selected):
            return False, "loading", statuses, errors
        return True, "ready", statuses, errors

    async def close(self) -> None:
        for bundle in self.selected:
            if bundle.batcher is not None:
                await bundle.batcher.stop(drain=True)
