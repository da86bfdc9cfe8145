"""The version-swap load test: its verdict, and a short live run on a tiny bundle."""

from __future__ import annotations

import json

from benchmarks.model_swap import judge, main

SERVED = ["1", "2", "3", "4"]
EVENTS = [{"version": v, "corrupted": False, "admin_status": 200} for v in SERVED[1:]] + [
    {"version": "5", "corrupted": True, "admin_status": 422}
]


def answer(version: str, status: int = 200, label: str | None = None) -> dict:
    return {
        "t": 0.0,
        "ms": 1.0,
        "status": status,
        "version": version,
        "label": label or f"positive@v{version}",
    }


def test_the_verdict_catches_failures_unverified_versions_and_mixed_answers():
    good = [answer(v) for v in SERVED]
    assert judge(good, SERVED, EVENTS)["passed"]
    for bad, check in (
        (answer("2", status=503), "zero_failed_requests"),
        (answer("9"), "every_answer_from_a_verified_version"),
        (answer("3", label="positive@v2"), "labels_match_the_version_header"),
        (answer("5"), "corrupted_version_never_answered"),
    ):
        verdict = judge([*good, bad], SERVED, EVENTS)
        assert not verdict["passed"] and not verdict["checks"][check], check
    assert not judge([answer(v) for v in SERVED[:3]], SERVED, EVENTS)["checks"]["three_swaps_each_served"]


def test_a_short_live_run_passes(tiny_bundles, tmp_path):
    argv = ["--bundle", str(tiny_bundles["classify"]), "--clients", "4", "--duration", "1.5"]
    assert main([*argv, "--work", str(tmp_path / "work"), "--out", str(tmp_path), "--name", "swap"]) == 0
    report = json.loads((tmp_path / "swap.json").read_text())
    assert report["served_versions"] == ["1", "2", "3", "4"] and report["verdict"]["failed"] == 0
    assert [e["admin_status"] for e in report["events"]] == [200, 200, 200, 422]
    assert (tmp_path / "swap.md").exists() and (tmp_path / "swap.png").exists()
