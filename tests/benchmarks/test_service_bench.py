"""service_bench: targets, CPU accounting, bare-model references, a tiny run of the in-repo servers,
and the peers' parts that need no peer installed: protocols, answer comparison, report, environments."""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

import psutil
import pytest

from app.settings import available_cores
from benchmarks import bench_common, service_bench, service_report
from benchmarks.loadgen_payloads import make_payload
from benchmarks.model_only import (
    BundleModel,
    batched_reference,
    pack,
    single_request_reference,
)


def level(concurrency: int, rps: float, p50: float, workload: str = "classify") -> dict:
    return {
        "workload": workload,
        "concurrency": concurrency,
        "throughput_rps": rps,
        "throughput_rps_by_round": [rps],
        "latency_ms": {"p50": p50, "p99": 2 * p50},
        "errors": 0,
        "cpu_ms_per_request": {"main_thread": 1.0, "other_threads": 3.0, "load_generator": 0.2},
    }


def test_targets_from_hand_numbers():
    entry = {
        "servers": {"ours": {"levels": [level(1, 50.0, 12.0), level(32, 180.0, 150.0)]}},
        "model_only": {
            "single_request": {"p50_ms": 10.0},
            "batched": {"requests_per_s": 190.0, "best_batch_size": 8, "best_requests_per_s": 195.0},
            "batched_layout": "2x1",
        },
    }
    t = service_report.targets(entry)
    c32 = t["c32_throughput_vs_model_batched"]
    # Judged against the model's best batch size and layout, not the batch-32 figure.
    assert c32["fraction"] == round(180 / 195, 3) and c32["passed"]  # 0.923 >= 0.85
    assert c32["model_layout"] == "2x1" and c32["model_batch_size"] == 8
    assert t["c1_overhead_p50"]["allowed_ms"] == 11.0 and not t["c1_overhead_p50"]["passed"]  # 12 > 1 + 10
    entry["servers"]["ours"]["levels"][0]["latency_ms"]["p50"] = 10.9
    assert service_report.targets(entry)["c1_overhead_p50"]["passed"]
    # Every default loaded against the model alone, the load on that model.
    entry["servers"]["ours-defaults"] = {"levels": [level(32, 172.0, 150.0)]}
    assert service_report.targets(entry)["c32_defaults_loaded_vs_alone"]["passed"]  # 172/180 = 0.956
    entry["servers"]["ours-defaults"]["levels"][0]["throughput_rps"] = 170.0
    assert not service_report.targets(entry)["c32_defaults_loaded_vs_alone"]["passed"]  # 0.944
    entry["servers"]["ours"]["levels"][1]["throughput_rps"] = 150.0
    assert not service_report.targets(entry)["c32_throughput_vs_model_batched"]["passed"]  # 0.79
    # Against the fastest real peer: 1.5x at c=32, ahead at c=1; a floor is never "the fastest peer".
    assert not any("peer" in name for name in service_report.targets(entry))
    entry["servers"]["ort"] = {"levels": [level(1, 500.0, 2.0), level(32, 900.0, 30.0)]}
    entry["servers"]["optimum"] = {"levels": [level(1, 50.0, 12.0), level(32, 80.0, 300.0)]}
    entry["servers"]["mlserver"] = {"levels": [level(1, 40.0, 14.0), level(32, 110.0, 250.0)]}
    entry["servers"]["fastembed"] = {"error": "failed: pip"}
    t = service_report.targets(entry)
    c1, c32 = t["classify c=1 vs fastest peer"], t["classify c=32 vs fastest peer"]
    assert c1["peer"] == "optimum" and c1["ratio"] == 1.0 and c1["passed"]
    assert c32["peer"] == "mlserver" and c32["ratio"] == 1.36 and not c32["passed"]  # 150/110 < 1.5


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(60)"
SPAWN = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}])"


def test_tree_cpu_seconds_counts_children():
    parent = subprocess.Popen([sys.executable, "-c", SPAWN])
    try:
        deadline = time.monotonic() + 20
        while bench_common.tree_cpu_seconds(parent.pid) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bench_common.tree_cpu_seconds(parent.pid) >= 0.6
        assert psutil.Process(parent.pid).cpu_times().user < 0.5  # the time is the child's, not the parent's
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_pack_respects_size_and_token_limits():
    lengths = [5, 7, 9, 30, 31, 40, 64, 64, 100]
    batches = pack([[0] * n for n in lengths], size=3, tokens=128)
    assert [len(x) for b in batches for x in b] == lengths  # order kept, nothing lost
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or max(map(len, batch)) * len(batch) <= 128


def test_model_only_references_on_a_tiny_bundle(tiny_bundles, regression_bundle):
    rng = random.Random(0)
    model = BundleModel(tiny_bundles["qa"], "fp32", threads=1)
    payloads = [make_payload("qa", rng) for _ in range(4)]
    # The references feed the model what the service would: the same QA windows.
    for payload in payloads:
        _, windows = model.answer(payload["question"], payload["context"])
        assert len(model.encodings(payload)) == windows >= 1
    single = single_request_reference(model, payloads, seconds=0.05)
    assert single["runs"] >= 4 and 0 < single["p50_ms"] <= single["p99_ms"]
    batched = batched_reference(model, payloads, seconds=0.05, sizes=(1, 4))
    assert batched["reference_batch_size"] == 4 and set(batched["by_batch_size"]) == {1, 4}
    assert batched["requests_per_s"] == batched["by_batch_size"][4]["requests_per_s"] > 0
    assert batched["sequences_per_request"] >= 1
    with pytest.raises(ValueError, match="no 'fp16' variant"):
        BundleModel(regression_bundle, "fp16")  # fp32 + int8 only


def test_the_one_request_reference_runs_on_the_session_a_lone_request_meets(tiny_bundles):
    # The server runs a lone request on its solo session (every core), not on one instance's.
    args = argparse.Namespace(model_seconds=0.02)
    bundle = tiny_bundles["classify"]
    solo = service_bench.model_only(
        bundle, "classify", args, {"instances": 2, "threads": 1, "solo_threads": 2}
    )
    assert solo["single_request_threads"] == 2 and solo["threads"] == 1
    assert solo["single_request"]["p50_ms"] > 0
    alone = service_bench.model_only(
        bundle, "classify", args, {"instances": 1, "threads": 1, "solo_threads": None}
    )
    assert alone["single_request_threads"] == 1


def test_the_bare_model_opens_its_sessions_with_the_servers_ort_settings(tiny_bundles, monkeypatch):
    # One rule (app.engine.registry.session_tuning): the server turns memory patterns off by default.
    def options(**kwargs):
        return BundleModel(
            tiny_bundles["classify"], "fp32", threads=2, **kwargs
        ).runtime.session.get_session_options()

    assert not options().enable_mem_pattern
    assert options(instances=2).get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options(solo=True).get_session_config_entry("session.force_spinning_stop") == "1"
    monkeypatch.setenv("ORT_MEM_PATTERN", "true")
    assert options().enable_mem_pattern


def test_batched_reference_runs_instances_side_by_side(tiny_bundles):
    payloads = [make_payload("classify", random.Random(1)) for _ in range(6)]
    model = BundleModel(tiny_bundles["classify"], "fp32", threads=1, instances=2)
    assert len(model.runtimes) == 2 and model.runtimes[0] is not model.runtimes[1]
    batched = batched_reference(model, payloads, seconds=0.05, sizes=(2,))
    assert batched["instances"] == 2 and batched["threads"] == 1
    # Both instances ran: at least one full pass each over the 3 batches.
    assert batched["by_batch_size"][2]["passes"] >= 2 and batched["requests_per_s"] > 0


def test_median_round_keeps_whole_rows_and_every_rounds_throughput():
    def run(rps1: float, rps32: float, ready: float) -> dict:
        levels = [level(1, rps1, 1000 / rps1), level(32, rps32, 32000 / rps32)]
        return {"command": ["x"], "ready_seconds": ready, "rss_mb_after_load": ready * 100, "levels": levels}

    merged = service_report.median_round([run(100, 150, 1.0), run(90, 180, 2.0), run(110, 130, 3.0)])
    assert merged["rounds"] == 3 and merged["rss_mb_after_load"] == 300
    c1, c32 = merged["levels"]
    assert c1["throughput_rps"] == 100 and c1["latency_ms"]["p50"] == 10.0  # the row of the median round
    assert c1["throughput_rps_by_round"] == [100, 90, 110]
    assert c32["throughput_rps"] == 150 and c32["throughput_rps_by_round"] == [150, 180, 130]
    # Even counts take the lower middle; a server that failed every round keeps its error.
    assert (
        service_report.median_round([run(100, 150, 1), run(90, 180, 2)])["levels"][1]["throughput_rps"] == 150
    )
    assert service_report.median_round([{"error": "boom"}]) == {"error": "boom"}


def quick_run(tmp_path, *args: str) -> tuple[dict, str]:
    """service_bench on the tiny classify bundle: its report entry for /classify and its markdown."""
    out = tmp_path / "results"
    code = service_bench.main([
        "--endpoints", "classify", "--duration", "0.3", "--warmup", "0.1", "--model-seconds", "0.1",
        "--work-dir", str(tmp_path / "work"), "--out", str(out), "--name", "quick", "--ready-timeout", "60",
        *args,
    ])  # fmt: skip
    assert code == 0
    report = json.loads((out / "quick.json").read_text())
    assert (out / "quick.png").stat().st_size > 1000
    return report["endpoints"]["classify"], (out / "quick.md").read_text()


def check_levels(server: dict, concurrency: list[int], rounds: int) -> None:
    assert server["rounds"] == rounds and len(server["ready_seconds_by_round"]) == rounds
    assert [r["concurrency"] for r in server["levels"]] == concurrency
    for row in server["levels"]:
        assert row["ok"] > 0 and row["errors"] == 0 and row["schema_errors"] == 0
        assert len(row["throughput_rps_by_round"]) == rounds
        assert row["throughput_rps"] == min(row["throughput_rps_by_round"])  # lower middle of two
        split = row["cpu_ms_per_request"]
        assert split["main_thread"] > 0 and split["other_threads"] >= 0 and split["load_generator"] > 0


def test_every_in_repo_server_runs_and_answers_as_ours(tiny_checkpoints, tiny_bundles, tmp_path):
    """One round of all five: each is loaded at every level and its labels are ours."""
    entry, text = quick_run(
        tmp_path, "--concurrency", "1,2", "--classify-bundle", str(tiny_bundles["classify"]),
        "--classify-checkpoint", str(tiny_checkpoints["classify"]),
    )  # fmt: skip
    assert set(entry["servers"]) == {"ours", "ours-no-solo", "ours-defaults", "ort", "pipeline"}
    (ours,) = entry["servers"]["ours"]["models"]["models"]  # our /models answered: the real app served it
    assert ours["solo_threads"] == (ours["instances"] if available_cores() >= 2 else None)
    assert "pipeline_server --ort --classify" in entry["servers"]["ort"]["command"]
    for name, server in entry["servers"].items():
        check_levels(server, [1, 2], rounds=1)
        if name != "ours":  # the same file or checkpoint as ours: the same labels
            assert server["answers"]["labels_agree"] == 1.0
    assert entry["model_only"]["single_request"]["p50_ms"] > 0
    assert set(entry["targets"]) == {"c1_overhead_p50"}  # no c=32 level, no real peer in this run
    assert "| pipeline | classify c=2 |" in text


def test_real_servers_alternate_over_rounds(tiny_bundles, tmp_path, capsys):
    """Two rounds of two of our servers (the cheap ones to start): the order rotates each round, and
    every level keeps the round with the lower middle throughput beside both rounds'."""
    servers = ["ours-no-solo", "ours-defaults"]
    entry, text = quick_run(
        tmp_path, "--servers", ",".join(servers), "--rounds", "2", "--concurrency", "1",
        "--classify-bundle", str(tiny_bundles["classify"]),
    )  # fmt: skip
    assert set(entry["servers"]) == set(servers)
    for server in entry["servers"].values():
        check_levels(server, [1], rounds=2)
    started = [line.split(": ")[1] for line in capsys.readouterr().out.splitlines() if " round " in line]
    assert started == [*servers, *reversed(servers)]
    assert "2 rounds, the servers alternating" in text


def test_ablations_are_our_server_with_settings_alternated_with_the_rest():
    args = service_bench.parse_args(
        ["--servers", "ours", "--ablation", "quiet:LOG_LEVEL=WARNING", "--ablation", "two:A=1,B=x=y"]
    )
    assert args.servers == ["ours", "ours-quiet", "ours-two"]
    assert args.ablations == {"ours-quiet": {"LOG_LEVEL": "WARNING"}, "ours-two": {"A": "1", "B": "x=y"}}
    with pytest.raises(SystemExit):
        service_bench.parse_args(["--ablation", "broken:NOEQUALS"])
    with pytest.raises(SystemExit):
        service_bench.parse_args(["--servers", "ours,nonesuch"])
    assert service_bench.parse_args(["--servers", "all"]).servers == list(service_bench.SERVERS)
