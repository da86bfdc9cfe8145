"""benchmarks.pretrain's report stage on a tiny real pretraining run: curves, unigram baseline,
the fine-tune table."""

from __future__ import annotations

import json
import random
from pathlib import Path

from benchmarks import pretrain
from tests.helpers.tiny import WORDS, tiny_sizes
from train.train import main as train_main
from train.vocab import build_vocab


def tiny_pretraining(work: Path) -> dict:
    rng = random.Random(0)
    documents = [
        "\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(4)) for _ in range(30)
    ]
    (work / "train.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    (work / "valid.txt").write_text("\n\n".join(documents[:6]) + "\n", encoding="utf-8")
    (work / "corpus.json").write_text(json.dumps({"race_passages": 30}), encoding="utf-8")
    build_vocab([work / "train.txt"], work / "vocab", vocab_size=150, min_frequency=1)
    shape = work / "shape.json"
    shape.write_text(json.dumps(tiny_sizes()), encoding="utf-8")
    return train_main(
        [
            *("--task", "pretrain", "--base", str(work / "vocab"), "--scratch-config", str(shape)),
            *("--train", str(work / "train.txt"), "--validation", str(work / "valid.txt")),
            *("--max-seq-len", "32", "--batch-size", "8", "--max-steps", "4", "--eval-every", "2"),
            *("--log-every", "1", "--no-progress", "--out", str(work / "run")),
        ]
    )


def test_report_from_a_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pretrain, "WORK", tmp_path / "work")
    (work := tmp_path / "work" / "en").mkdir(parents=True)
    summary = tiny_pretraining(work)
    for init, accuracy in (("pretrained", 0.75), ("random", 0.625)):
        (work / f"finetune-{init}").mkdir()
        metrics = {
            "validation": {"accuracy": accuracy},
            "best": {"value": accuracy},
            "steps": 10,
            "wall_time_s": 60.0,
            "command": "python -m train --task classify",
        }
        (work / f"finetune-{init}" / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    pretrain.main(["--stage", "report", "--lang", "en", "--out", str(tmp_path / "results")])

    report = json.loads((tmp_path / "results" / "pretrain_en.json").read_text())
    assert report["final"] == summary["validation"] and report["steps"] == 4
    assert report["stopped_by"] == "steps" and report["vocab_size"] == 150
    baseline = report["unigram_baseline"]
    vocab = (work / "vocab" / "vocab.txt").read_text().splitlines()
    assert 0 < baseline["accuracy"] < 1 and baseline["masked_positions"] > 0 and baseline["token"] in vocab
    assert [step for step, _ in report["curves"]["eval/mlm_accuracy"]] == [2, 4]
    assert report["commands"][0].startswith("python -m train.corpus en")
    assert report["commands"][-1] == summary["command"]
    markdown = (tmp_path / "results" / "pretrain_en.md").read_text()
    assert f"{report['final']['mlm_accuracy']:.4f}" in markdown and "unigram baseline" in markdown
    assert (tmp_path / "results" / "pretrain_en.png").stat().st_size > 10_000
    table = (tmp_path / "results" / "pretrain_finetune.md").read_text()
    assert "| 0.7500 | 0.6250 |" in table and "0.8851" in table
