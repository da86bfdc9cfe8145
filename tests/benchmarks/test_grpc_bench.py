"""grpc_bench: one tiny run of its three transports on a tiny classify bundle, and its report."""

from __future__ import annotations

import json

from benchmarks import grpc_bench


def test_a_tiny_run_measures_every_transport(tiny_bundles, tmp_path):
    bundle = tiny_bundles["classify"]
    argv = ["--models-dir", str(bundle.parent), "--model", bundle.name, "--workloads", "1x1,2x3"]
    argv += ["--rounds", "1", "--duration", "0.4", "--warmup", "0.1", "--name", str(tmp_path / "g")]
    assert grpc_bench.main(argv) == 0
    report = json.loads((tmp_path / "g.json").read_text())
    assert set(report["medians"]) == {"1x1", "2x3"}
    for cells in report["medians"].values():
        assert set(cells) == set(grpc_bench.TRANSPORTS)
        assert all(cell["req_s"] > 0 and cell["mean_batch"] >= 1 for cell in cells.values())
    assert "| 2x3 | v2-grpc |" in (tmp_path / "g.md").read_text() and (tmp_path / "g.png").exists()
