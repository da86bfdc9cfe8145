"""qa_vs_pipeline end to end on a tiny model and a tiny SQuAD file; the skip path without data."""

from __future__ import annotations

import json

from benchmarks import qa_vs_pipeline

from .conftest import write_squad


def test_writes_well_formed_results(tiny_checkpoints, tiny_bundles, tmp_path):
    data = write_squad(tmp_path / "squad.json", articles=3)
    out = tmp_path / "results"
    code = qa_vs_pipeline.main([
        "--quick", "--data", str(data), "--articles", "all", "--bundle", str(tiny_bundles["qa"]),
        "--checkpoint", str(tiny_checkpoints["qa"]), "--variants", "fp32,int8", "--sizes", "200,800",
        "--latency-questions", "2", "--repeats", "1", "--threads", "1", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    report = json.loads((out / "qa_vs_pipeline_quick.json").read_text())
    assert report["questions"] == 6
    assert set(report["scores"]) == {"ours-fp32", "ours-int8", "transformers"}
    for scores in report["scores"].values():
        assert 0.0 <= scores["exact_match"] <= scores["f1"] <= 100.0
    fp32 = report["agreement"]["ours-fp32"]
    assert fp32["questions"] == 6 and 0 <= fp32["same_span"] <= fp32["same_normalized_text"] <= 6
    latency = report["latency"]
    assert len(latency["rows"]) == 3 * 2 * 2  # readers x sizes x questions
    assert {r["target_chars"] for r in latency["rows"]} == {200, 800}
    assert all(r["chars"] == r["target_chars"] and r["ms"] > 0 for r in latency["rows"])
    for fit in latency["fits"].values():
        assert fit["ms_per_1k_chars"] is not None and fit["loglog_exponent"] is not None
        assert set(fit["mean_ms_by_size"]) == {"200", "800"}
    assert report["machine"]["cpu"] and report["machine"]["versions"]["onnxruntime"]
    assert report["settings"]["articles"].startswith("all: 3 of 3 articles")
    assert (out / "qa_vs_pipeline_quick.png").stat().st_size > 1000
    assert "ours-fp32" in (out / "qa_vs_pipeline_quick.md").read_text()


def test_skips_cleanly_without_data(tmp_path, capsys):
    code = qa_vs_pipeline.main(["--data", str(tmp_path / "missing.json"), "--out", str(tmp_path / "out")])
    assert code == 0
    assert "skipping" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()
