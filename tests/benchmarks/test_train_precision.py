"""benchmarks.train_precision: both precisions timed alike, and the report says which one training uses."""

from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("torch")


def test_both_precisions_are_timed_and_reported(tmp_path):
    from benchmarks.train_precision import measure, report, write
    from train.trainer import cpu_has_fast_bf16

    times = measure(threads=1, batch_size=2, seq=8, steps=2, rounds=2, layers=1)
    assert {p: len(t) for p, t in times.items()} == {"fp32": 4, "bf16": 4}
    assert all(s > 0 for t in times.values() for s in t)
    args = argparse.Namespace(threads=1, batch=2, seq=8, steps=2, rounds=2)
    result = report(times, args)
    assert result["bf16_over_fp32"] == pytest.approx(
        result["median_step_s"]["bf16"] / result["median_step_s"]["fp32"]
    )
    assert result["command"].startswith("python -m benchmarks.train_precision")
    write(result, tmp_path)
    saved = json.loads((tmp_path / "train_precision.json").read_text())
    assert saved["cpu_has_fast_bf16"] == cpu_has_fast_bf16()
    table = (tmp_path / "train_precision.md").read_text()
    assert "| fp32 |" in table and "| bf16 |" in table
    assert f"trains in {'bf16' if cpu_has_fast_bf16() else 'fp32'} here" in table
