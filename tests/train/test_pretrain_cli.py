"""Pretraining from scratch through the CLI: a vocabulary built from the corpus, random weights
shaped by --scratch-config, MLM and NSP accuracy logged, and a run stopped mid-way that resumes onto
the same curve. The one CLI test of --stop-after-steps and --resume (tests/train/test_training.py
checks the trainer's exact resume with dropout and accumulation)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.tiny import WORDS, tiny_sizes
from train.train import main
from train.vocab import build_vocab


def scalars(log_dir: Path, tag: str) -> dict[int, float]:
    """step -> value of a TensorBoard scalar, over every events file in log_dir (a resumed run
    appends a second one)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {e.step: e.value for e in accumulator.Scalars(tag)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("pretrain-cli")
    rng = random.Random(0)
    documents = [
        [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(rng.randint(2, 6))]
        for _ in range(60)
    ]
    text = "\n\n".join("\n".join(d) for d in documents) + "\n"
    (root / "train.txt").write_text(text, encoding="utf-8")
    (root / "valid.txt").write_text(
        "\n\n".join("\n".join(d) for d in documents[:10]) + "\n", encoding="utf-8"
    )
    vocab = build_vocab([root / "train.txt"], root / "vocab", vocab_size=200, min_frequency=1)
    shape = root / "shape.json"
    shape.write_text(
        json.dumps({**tiny_sizes(), "task": "classify", "id2label": {"0": "x"}}), encoding="utf-8"
    )
    return root, vocab, shape


def pretrain(corpus, out: Path, *extra: str) -> dict:
    root, vocab, shape = corpus
    return main(
        [
            *("--task", "pretrain", "--base", str(vocab), "--scratch-config", str(shape)),
            *("--train", str(root / "train.txt"), "--validation", str(root / "valid.txt")),
            *("--max-seq-len", "32", "--batch-size", "8", "--max-steps", "6", "--eval-every", "2"),
            *("--lr", "1e-3", "--warmup-steps", "2", "--log-every", "1", "--no-progress", "--seed", "3"),
            *("--out", str(out)),
            *extra,
        ]
    )


def test_resumed_pretraining_continues_the_same_curve(corpus, tmp_path: Path) -> None:
    straight = pretrain(corpus, tmp_path / "straight")
    assert straight["finished"] and straight["steps"] == 6
    assert {"mlm_accuracy", "nsp_accuracy", "loss"} <= set(straight["validation"])
    config = json.loads((tmp_path / "straight" / "config.json").read_text())
    assert config["task"] == "pretrain" and config["vocab_size"] == 200 and "id2label" not in config
    assert (tmp_path / "straight" / "vocab.txt").exists()

    first = pretrain(corpus, tmp_path / "resumed", "--stop-after-steps", "3")
    assert not first["finished"] and first["steps"] == 3
    assert not (tmp_path / "resumed" / "metrics.json").exists()  # written by a finished run only
    second = pretrain(corpus, tmp_path / "resumed", "--resume")
    assert second["finished"] and second["steps"] == 6
    assert second["validation"] == straight["validation"]
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    train_tags = ("train/loss", "train/lr", "train/mlm_loss", "train/mlm_accuracy", "train/nsp_accuracy")
    for tag in (*train_tags, "eval/mlm_accuracy", "eval/nsp_accuracy"):
        assert scalars(tmp_path / "resumed" / "runs", tag) == scalars(tmp_path / "straight" / "runs", tag), (
            tag
        )
    assert len(list((tmp_path / "resumed" / "runs").iterdir())) == 2, "one events file per run"
    for tag in train_tags:  # --log-every 1: every step logged
        assert sorted(scalars(tmp_path / "straight" / "runs", tag)) == [1, 2, 3, 4, 5, 6], tag


def test_loader_workers_collate_the_same_batches(corpus, tmp_path: Path) -> None:
    """Masks drawn in worker processes, also after a resume mid-epoch, train the same weights."""
    straight = pretrain(corpus, tmp_path / "straight")
    first = pretrain(corpus, tmp_path / "workers", "--loader-workers", "2", "--stop-after-steps", "3")
    assert first["steps"] == 3
    second = pretrain(corpus, tmp_path / "workers", "--loader-workers", "2", "--resume")
    assert second["finished"] and second["validation"] == straight["validation"]
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "workers" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    for tag in ("train/loss", "train/mlm_accuracy"):
        assert scalars(tmp_path / "workers" / "runs", tag) == scalars(tmp_path / "straight" / "runs", tag), (
            tag
        )
