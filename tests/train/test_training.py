"""The training loop on tiny checkpoints: every task learns, resume is exact, the CLI writes a
loadable checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from model.bert import TASK_HEADS
from processing.tokenizer import TextTokenizer
from tests.helpers.tiny import make_tiny_checkpoint
from train.features import TASK_FEATURES, FeatureOptions
from train.readers import read_examples
from train.train import base_labels, build_model, build_parser, main
from train.train_utils import epoch_batches, parameter_groups
from train.trainer import STATE_FILE, TrainConfig, Trainer

from .tiny_data import write_task_data

OPTIONS = FeatureOptions(max_seq_len=64, doc_stride=16, max_query_len=16, window_overlap=8)
ALL_TASKS = ["classify", "ner", "multiple-choice", "qa"]


def build(task: str, tmp_path: Path, config: TrainConfig, dropout: float = 0.0):
    base = make_tiny_checkpoint(task, tmp_path / "base", hidden_dropout_prob=dropout)
    data_path = write_task_data(task, tmp_path / "data")
    examples = read_examples(task, data_path)
    handler = TASK_FEATURES[task](TextTokenizer.from_dir(base), OPTIONS)
    handler.fit_labels(examples, None, base_labels(task, base))
    torch.manual_seed(config.seed)
    model = build_model(handler, base)
    train = handler.features(examples, train=True)
    valid = handler.features(examples, train=False)
    return Trainer(model, handler, train, valid, config, tmp_path / "out")


@pytest.mark.parametrize("task", ALL_TASKS)
def test_loss_falls(task: str, tmp_path: Path) -> None:
    config = TrainConfig(
        max_steps=25,
        batch_size=8,
        lr=3e-3,
        schedule="constant",
        weight_decay=0.0,
        eval_every=1000,
        progress=False,
        metric_for_best="loss",
    )
    trainer = build(task, tmp_path, config)
    before = trainer.evaluate()["loss"]
    trainer.train()
    after = trainer.evaluate()["loss"]
    assert after < 0.8 * before, (task, before, after)


@pytest.mark.parametrize("trim", [True, False])
def test_cpu_training_trims_the_heap_after_every_step(trim: bool, tmp_path: Path, monkeypatch) -> None:
    import platform

    import train.trainer
    from train.train_utils import release_freed_memory

    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert release_freed_memory() is True
    calls = []
    monkeypatch.setattr(train.trainer, "release_freed_memory", lambda: calls.append(1) or True)
    config = TrainConfig(max_steps=3, batch_size=8, eval_every=1000, progress=False, trim_memory=trim)
    build("classify", tmp_path, config).train()
    assert len(calls) == (3 if trim else 0)


def test_resume_is_exact(tmp_path: Path) -> None:
    # Dropout on, accumulation on, a decaying schedule, and a stop mid-epoch: all must replay.
    config = TrainConfig(
        max_steps=8,
        batch_size=4,
        grad_accum=2,
        lr=2e-3,
        schedule="linear",
        warmup_steps=2,
        eval_every=3,
        progress=False,
        metric_for_best="loss",
    )
    straight = build("classify", tmp_path / "a", config, dropout=0.1)
    straight.train()

    first = build(
        "classify", tmp_path / "b", TrainConfig(**{**config.__dict__, "stop_after_steps": 3}), dropout=0.1
    )
    first.train()
    assert first.step == 3 and (tmp_path / "b" / "out" / STATE_FILE).exists()
    resumed = build("classify", tmp_path / "b", config, dropout=0.1)
    resumed.load_state(tmp_path / "b" / "out")
    resumed.train()

    assert resumed.step == straight.step == 8
    for (name, a), (_, b) in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert resumed.evaluate()["loss"] == straight.evaluate()["loss"]
    assert resumed.best["step"] == straight.best["step"]


def test_resume_without_state_is_an_error(tmp_path: Path) -> None:
    trainer = build("classify", tmp_path, TrainConfig(max_steps=1, progress=False))
    with pytest.raises(FileNotFoundError, match=STATE_FILE):
        trainer.load_state(tmp_path / "nowhere")


def test_epoch_batches_are_a_function_of_seed_and_epoch() -> None:
    lengths = torch.randint(1, 50, (100,)).numpy()
    a = epoch_batches(lengths, 100, 8, seed=1, epoch=0)
    assert [b.tolist() for b in a] == [b.tolist() for b in epoch_batches(lengths, 100, 8, 1, 0)]
    assert [b.tolist() for b in a] != [b.tolist() for b in epoch_batches(lengths, 100, 8, 1, 1)]
    assert sorted(i for b in a for i in b.tolist()) == list(range(100))


def test_no_weight_decay_on_bias_and_layernorm(tmp_path: Path) -> None:
    model = TASK_HEADS["classify"].from_pretrained(make_tiny_checkpoint("classify", tmp_path))
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(not names[id(p)].endswith("bias") and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_freeze_embeddings(tmp_path: Path) -> None:
    config = TrainConfig(
        max_steps=2,
        batch_size=8,
        lr=1e-2,
        freeze_embeddings=True,
        progress=False,
        eval_every=1000,
        metric_for_best="loss",
    )
    trainer = build("classify", tmp_path, config)
    embeddings = trainer.model.bert.embeddings
    tables = [
        embeddings.word_embeddings.weight,
        embeddings.position_embeddings.weight,
        embeddings.token_type_embeddings.weight,
    ]
    before = [t.detach().clone() for t in tables]
    layer_norm = embeddings.LayerNorm.weight.detach().clone()
    trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, tables, strict=True))
    assert not torch.equal(layer_norm, embeddings.LayerNorm.weight)


def test_help_documents_every_option(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for action in build_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings} has no help"
            assert action.option_strings[0] in text


def test_cli_end_to_end_writes_loadable_checkpoint(tmp_path: Path) -> None:
    base = make_tiny_checkpoint("classify", tmp_path / "base")
    data = write_task_data("classify", tmp_path / "data")
    out = tmp_path / "out"
    summary = main(
        [
            "--task",
            "classify",
            "--base",
            str(base),
            "--train",
            str(data),
            "--validation-fraction",
            "0.25",
            "--max-steps",
            "4",
            "--batch-size",
            "8",
            "--max-seq-len",
            "32",
            "--lr",
            "1e-3",
            "--out",
            str(out),
            "--no-progress",
            "--eval-every",
            "2",
        ]
    )
    assert summary["steps"] == 4
    model = TASK_HEADS["classify"].from_pretrained(out)
    assert model.config.task == "classify"
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert (out / "vocab.txt").exists() and (out / "best" / "model.safetensors").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["validation"]) >= {"accuracy", "f1", "loss"}
    assert metrics["wall_time_s"] > 0 and "--task classify" in metrics["command"]
    assert list((out / "runs").iterdir()), "no TensorBoard events written"


def test_extra_train_data_is_added_but_never_validated_on(tmp_path: Path) -> None:
    from train.train import make_task, prepare_data

    base = make_tiny_checkpoint("qa", tmp_path / "base")
    data = write_task_data("qa", tmp_path / "data")
    article = "Ann has a cat. The cat is black. It sleeps all day."
    extra = tmp_path / "race.jsonl"
    rows = [
        {
            "id": f"p{i}",
            "article": article,
            "questions": ["What colour is the cat?"],
            "options": [["white", "black", "grey", "brown"]],
            "answers": ["B"],
        }
        for i in range(3)
    ]
    extra.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [
        "--task",
        "qa",
        "--train",
        str(data),
        "--validation-fraction",
        "0.3",
        "--max-seq-len",
        "64",
        "--doc-stride",
        "16",
        "--max-query-len",
        "16",
        "--out",
        str(tmp_path / "out"),
    ]
    tokenizer = TextTokenizer.from_dir(base)
    args = build_parser().parse_args(common)
    plain_train, plain_valid = prepare_data(args, make_task(args, tokenizer), base, None)
    args = build_parser().parse_args([*common, "--extra-train", str(extra), "--limit-extra", "2"])
    train, valid = prepare_data(args, make_task(args, tokenizer), base, None)
    assert len(train.examples) == len(plain_train.examples) + 2
    assert [e.id for e in valid.examples] == [e.id for e in plain_valid.examples]
    assert {e.context for e in train.examples[-2:]} == {article}


def test_qa_doc_stride_that_does_not_fit_is_rejected(tmp_path: Path) -> None:
    base = make_tiny_checkpoint("qa", tmp_path / "base")
    data = write_task_data("qa", tmp_path / "data")
    with pytest.raises(ValueError, match="doc_stride"):
        main(
            [
                "--task",
                "qa",
                "--base",
                str(base),
                "--train",
                str(data),
                "--max-seq-len",
                "32",
                "--doc-stride",
                "30",
                "--out",
                str(tmp_path / "out"),
                "--max-steps",
                "1",
            ]
        )


def test_bf16_autocast_trains_on_cpu(tmp_path: Path) -> None:
    config = TrainConfig(
        max_steps=3,
        batch_size=8,
        lr=1e-3,
        precision="bf16",
        progress=False,
        eval_every=1000,
        metric_for_best="loss",
    )
    trainer = build("ner", tmp_path, config)
    summary = trainer.train()
    assert summary["steps"] == 3 and torch.isfinite(torch.tensor(summary["train_loss"]))
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights stay fp32


def test_fp16_without_gpu_is_a_clear_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="fp16 needs a CUDA GPU"):
        build("classify", tmp_path, TrainConfig(precision="fp16", progress=False))


@pytest.mark.slow
def test_torchrun_data_parallel_on_cpu(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    base = make_tiny_checkpoint("classify", tmp_path / "base")
    data = write_task_data("classify", tmp_path / "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        "-m",
        "train",
        "--task",
        "classify",
        "--base",
        str(base),
        "--train",
        str(data),
        "--validation",
        str(data),
        "--max-steps",
        "4",
        "--batch-size",
        "4",
        "--grad-accum",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        "--num-threads",
        "1",
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=240, cwd=Path(__file__).resolve().parents[2]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 4
    # 32 examples / batch 4 = 8 batches, 4 per process, 2 per optimizer step: 2 steps per epoch
    assert metrics["epochs"] == 2.0


def test_unknown_metric_for_best_is_rejected_before_training(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exact_match"):
        main(["--task", "qa", "--train", "x.json", "--out", str(tmp_path), "--metric-for-best", "accuracy"])


def test_cli_reports_bad_data_in_one_line(tmp_path: Path, monkeypatch) -> None:
    """`python -m train` (train.train.cli) exits with one line naming file and line, no traceback;
    test_torchrun_data_parallel_on_cpu runs `python -m train` as a process."""
    from train.train import cli

    base = make_tiny_checkpoint("ner", tmp_path / "base")
    bad = tmp_path / "bad.txt"
    bad.write_text("EU NNP B-NP B-ORG\nrejects\n", encoding="utf-8")
    argv = ["--task", "ner", "--base", str(base), "--train", str(bad), "--out", str(tmp_path / "out")]
    monkeypatch.setattr("sys.argv", ["python -m train", *argv])
    with pytest.raises(SystemExit) as exit_:
        cli()
    message = exit_.value.code  # sys.exit(str): Python prints it to stderr and exits with status 1
    assert isinstance(message, str) and message.startswith(f"error: {bad}:2:") and "\n" not in message


def test_time_budget_ends_the_run_like_its_last_step(tmp_path: Path) -> None:
    config = TrainConfig(max_steps=50, batch_size=4, eval_every=1000, progress=False, max_minutes=1e-9)
    trainer = build("classify", tmp_path, config)
    summary = trainer.train()
    # Stopped after the first step, then evaluated and saved as a finished run.
    assert summary["steps"] == 1 and summary["finished"] and summary["stopped_by"] == "time budget"
    assert summary["validation"] and trainer.last_eval_step == 1
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["stopped_by"] == "time budget" and metrics["total_steps"] == 50
    assert (
        build("classify", tmp_path / "b", TrainConfig(max_steps=2, progress=False)).train()["stopped_by"]
        == "steps"
    )


def test_token_dropout_masks_real_tokens_only(tmp_path: Path) -> None:
    trainer = build(
        "classify", tmp_path, TrainConfig(max_steps=1, batch_size=8, token_dropout=1.0, progress=False)
    )
    t = trainer.task.tokenizer
    ids = torch.tensor([[t.cls_id, 7, 8, 9, t.sep_id, t.pad_id, t.pad_id]])
    assert trainer.drop_tokens(ids).tolist() == [[t.cls_id, *[t.mask_id] * 3, t.sep_id, t.pad_id, t.pad_id]]
    trainer.config.token_dropout = 0.5
    torch.manual_seed(0)
    dropped = trainer.drop_tokens(torch.full((64, 32), 9))
    assert 0.4 < float((dropped == t.mask_id).float().mean()) < 0.6


def test_token_dropout_is_refused_for_pretraining(tmp_path: Path) -> None:
    args = ["--task", "pretrain", "--train", str(tmp_path / "x.txt"), "--out", str(tmp_path / "o")]
    (tmp_path / "x.txt").write_text("a b\n\nc d\n")
    with pytest.raises(ValueError, match="token-dropout"):
        main(
            [*args, "--base", str(make_tiny_checkpoint("classify", tmp_path / "b")), "--token-dropout", "0.1"]
        )
