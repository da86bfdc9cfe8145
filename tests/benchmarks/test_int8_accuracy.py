"""int8_accuracy.py: costs per variant and mode, and a run over some bundles keeps the others."""

from __future__ import annotations

import json

import pytest


def line(cost: float, gap: float = 0.0) -> dict:
    scores = {
        "fused": {"batched": {"f1": 70.0}, "single": {"f1": 70.0}},
        "int8": {"batched": {"f1": 70.0 - cost}, "single": {"f1": 70.0 - cost - gap}},
    }
    from benchmarks.int8_accuracy import summarize

    return {"metric": "f1", "scores": scores, "summary": summarize("f1", scores)}


def test_summary_reports_cost_per_mode_and_the_batched_single_gap():
    summary = line(0.5, gap=0.25)["summary"]
    assert "cost" not in summary["fused"] and summary["fused"]["batched_minus_single"] == 0
    assert summary["int8"]["cost"] == {"batched": pytest.approx(0.5), "single": pytest.approx(0.75)}
    assert summary["int8"]["batched_minus_single"] == pytest.approx(0.25)


def test_results_merge_with_earlier_runs(tmp_path):
    from benchmarks.int8_accuracy import merge_results

    path = tmp_path / "int8_accuracy.json"
    merge_results({"sst2-minilm": line(0.1), "squad-minilm": line(1.9)}, path)
    table = merge_results({"squad-minilm": line(1.5)}, path)
    merged = json.loads(path.read_text())
    assert merged["sst2-minilm"]["summary"]["int8"]["cost"]["batched"] == pytest.approx(0.1)
    assert merged["squad-minilm"]["summary"]["int8"]["cost"]["batched"] == pytest.approx(1.5)
    assert "| sst2-minilm | f1 | int8 |" in table and "+1.5000" in table and "+1.9000" not in table
    assert path.with_suffix(".md").read_text().strip() == table
    # A run of one variant replaces that variant's scores and keeps the others'.
    only = {"metric": "f1", "scores": {"int8": {"batched": {"f1": 69.0}, "single": {"f1": 69.0}}}}
    merge_results({"sst2-minilm": only}, path)
    summary = json.loads(path.read_text())["sst2-minilm"]["summary"]
    assert summary["fused"]["batched"] == 70.0 and summary["int8"]["cost"]["batched"] == pytest.approx(1.0)
