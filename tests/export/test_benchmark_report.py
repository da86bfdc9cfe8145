"""Smoke test of the latency benchmark's timing and report writers (no models run)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("export_latency", ROOT / "benchmarks" / "export_latency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_time_call_respects_runs_and_budget():
    bench = load_benchmark()
    calls = []
    stats = bench.time_call(lambda: calls.append(1), runs=5, budget_s=10, warmup=2)
    assert stats["runs"] == 5 and len(calls) == 7
    slow = bench.time_call(lambda: time.sleep(0.02), runs=100, budget_s=0.05, warmup=0)
    assert 3 <= slow["runs"] < 100 and slow["median_ms"] >= 20


def test_report_writers(tmp_path):
    bench = load_benchmark()
    shapes = [(1, 8), (2, 8)]
    results = [
        {"model": "m", "engine": e, "batch": b, "seq": s, "median_ms": 10.0 / (i + 1), "runs": 3}
        for i, e in enumerate(bench.ENGINES)
        for b, s in shapes
    ]
    report = {
        "created_at": "now",
        "machine": bench.machine_info(threads=1),
        "settings": {"quick": True, "shapes": shapes, "runs": 3, "warmup": 1, "budget_s": 1.0},
        "models": {
            "m": {
                "layers": 2,
                "hidden_size": 32,
                "fused_operator_counts": {"Attention": 2},
                "bundle_mb": {"fp32": 1.0},
                "export_seconds": 1.0,
                "int8_vs_fp32": {"argmax_agreement": 1.0, "max_abs_diff": 0.1},
            }
        },
        "results": results,
    }
    text = bench.markdown(report)
    assert report["machine"]["cpu"] in text
    assert "| 1 x 8 | 10.0 (1.00x) | 5.0 (2.00x)" in text  # ours-torch is the 1.00x baseline
    bench.plot(report, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
