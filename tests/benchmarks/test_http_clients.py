"""benchmarks/http_clients.py, smoke-sized: every client gets answers and the report says who wins."""

from __future__ import annotations

import json

from benchmarks import http_clients


def test_smoke_run_measures_every_client(tmp_path) -> None:
    assert (
        http_clients.main(
            ["--requests", "40", "--rounds", "1", "--concurrency", "1,4", "--out", str(tmp_path)]
        )
        == 0
    )
    report = json.loads((tmp_path / "http_clients.json").read_text())
    assert set(report["results"]) == {"1", "4"}
    for clients in report["results"].values():
        assert set(clients) == set(http_clients.CLIENTS)
        assert all(r["cpu_ms_per_request"] > 0 and r["requests_per_s"] > 0 for r in clients.values())
    assert report["command"].startswith("python -m benchmarks.http_clients")
    assert "rawhttp spends" in (tmp_path / "http_clients.md").read_text()
