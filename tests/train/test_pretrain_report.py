"""The pretraining results docs/pretraining.md cites, from tiny real runs: the curves of a run
stopped and resumed are one curve, the held-out numbers sit beside the unigram baseline, and the
fine-tuning table scores each run's best checkpoint on the test file."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.helpers.tiny import WORDS, tiny_sizes
from train.pretrain_report import main as report
from train.train import main as train
from train.vocab import build_vocab


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pretrain-report")
    rng = random.Random(0)
    documents = [
        "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(4))
        for _ in range(40)
    ]
    (root / "train.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    (root / "valid.txt").write_text("\n\n".join(documents[:8]) + "\n", encoding="utf-8")
    (root / "corpus.json").write_text(json.dumps({"train_documents": 40}), encoding="utf-8")
    build_vocab([root / "train.txt"], root / "vocab", vocab_size=200, min_frequency=1)
    (root / "shape.json").write_text(json.dumps(tiny_sizes()), encoding="utf-8")
    pretrain = [
        *("--task", "pretrain", "--base", str(root / "vocab"), "--scratch-config", str(root / "shape.json")),
        *("--train", str(root / "train.txt"), "--validation", str(root / "valid.txt"), "--max-seq-len", "32"),
        *("--batch-size", "8", "--max-steps", "6", "--eval-every", "2", "--log-every", "1", "--no-progress"),
        *("--lr", "1e-3", "--num-threads", "1", "--out", str(root / "run")),
    ]
    train([*pretrain, "--stop-after-steps", "3"])
    train([*pretrain, "--resume"])  # a second events file: the report joins them
    lines = [f"{' '.join(rng.choice(WORDS) for _ in range(5))}_!_{i % 2}" for i in range(48)]
    (root / "labelled.txt").write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    (root / "test.txt").write_text("\n".join(lines[40:]) + "\n", encoding="utf-8")
    random_weights = ["--base", str(root / "vocab"), "--scratch-config", str(root / "shape.json")]
    for name, base in (("ft-pretrained", ["--base", str(root / "run")]), ("ft-random", random_weights)):
        train([
            "--task", "classify", "--train", str(root / "labelled.txt"), "--validation-fraction", "0.2",
            "--max-seq-len", "16", "--batch-size", "8", "--epochs", "1", "--no-progress",
            "--num-threads", "1", *base, "--out", str(root / name),
        ])  # fmt: skip
    return root


def test_pretraining_curves_join_the_resumed_parts(work: Path, tmp_path: Path) -> None:
    report(["pretrain", str(work), "--out", str(tmp_path / "pretrain_zh")])
    saved = json.loads((tmp_path / "pretrain_zh.json").read_text(encoding="utf-8"))
    assert [step for step, _ in saved["curves"]["eval/mlm_accuracy"]] == [2, 4, 6]
    assert [step for step, _ in saved["curves"]["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert saved["steps"] == 6 and saved["stopped_by"] == "steps"
    assert 0 < saved["unigram_baseline"]["accuracy"] < 1
    assert saved["unigram_baseline"]["masked_positions"] > 0
    text = (tmp_path / "pretrain_zh.md").read_text(encoding="utf-8")
    assert "| 6 | " in text and f"{saved['final']['mlm_accuracy']:.4f}" in text
    assert "![curves](pretrain_zh.png)" in text
    assert (tmp_path / "pretrain_zh.png").stat().st_size > 10_000


def test_finetune_table_scores_best_checkpoints_on_test(work: Path, tmp_path: Path) -> None:
    report(["finetune", str(work), "--runs", "ft-pretrained,ft-random", "--test", str(work / "test.txt"),
            "--out", str(tmp_path / "pretrain_finetune")])  # fmt: skip
    saved = json.loads((tmp_path / "pretrain_finetune.json").read_text(encoding="utf-8"))
    assert set(saved["runs"]) == {"ft-pretrained", "ft-random"}
    for run in saved["runs"].values():
        assert run["command"].startswith("python -m train --task classify")
        assert 0 <= run["test"]["accuracy"] <= 1 and "accuracy" in run["valid_best"]
    text = (tmp_path / "pretrain_finetune.md").read_text(encoding="utf-8")
    assert text.count("| ft-") == 2
