"""int8_accuracy.py: a run over some bundles keeps the other bundles' measurements."""

from __future__ import annotations

import json


def line(cost: float) -> dict:
    return {
        "metric": "f1",
        "variants": {"fused": {"f1": 70.0}, "int8": {"f1": 70.0 - cost}},
        "int8_cost": cost,
    }


def test_results_merge_with_earlier_runs(tmp_path):
    from benchmarks.int8_accuracy import write_results

    path = tmp_path / "int8_accuracy.json"
    write_results({"sst2-minilm": line(0.1), "squad-minilm": line(1.9)}, path)
    table = write_results({"squad-minilm": line(1.5)}, path)
    merged = json.loads(path.read_text())
    assert merged["sst2-minilm"]["int8_cost"] == 0.1 and merged["squad-minilm"]["int8_cost"] == 1.5
    assert "| sst2-minilm |" in table and "+1.5000" in table and "+1.9000" not in table
    assert path.with_suffix(".md").read_text().strip() == table
