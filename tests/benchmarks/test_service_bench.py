"""service_bench: targets, CPU accounting, model-only references, and a tiny run of both real servers."""

from __future__ import annotations

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
    tokenize_reference,
)


def level(concurrency: int, rps: float, p50: float, mean: float, main_ms: float = 1.0) -> dict:
    return {
        "concurrency": concurrency,
        "throughput_rps": rps,
        "latency_ms": {"p50": p50, "mean": mean},
        "cpu_ms_per_request": {"main_thread": main_ms, "other_threads": 3.0, "load_generator": 0.2},
    }


def test_targets_from_hand_numbers():
    entry = {
        "servers": {"ours": {"levels": [level(1, 50.0, 12.0, 14.0), level(32, 180.0, 150.0, 160.0)]}},
        "model_only": {
            "single_request": {"p50_ms": 10.0, "mean_ms": 11.0},
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
    assert t["c1_overhead_mean"]["allowed_ms"] == 12.0 and not t["c1_overhead_mean"]["passed"]  # 14 > 12
    entry["servers"]["ours"]["levels"][0]["latency_ms"]["p50"] = 10.9
    assert service_report.targets(entry)["c1_overhead_p50"]["passed"]
    entry["servers"]["ours"]["levels"][0]["latency_ms"]["p50"] = 12.0
    # Every default loaded against the model alone, the load on that model.
    entry["servers"]["ours-defaults"] = {"levels": [level(32, 172.0, 150.0, 160.0)]}
    assert service_report.targets(entry)["c32_defaults_loaded_vs_alone"]["passed"]  # 172/180 = 0.956
    entry["servers"]["ours-defaults"]["levels"][0]["throughput_rps"] = 170.0
    assert not service_report.targets(entry)["c32_defaults_loaded_vs_alone"]["passed"]  # 0.944
    del entry["servers"]["ours-defaults"]
    entry["servers"]["ours"]["levels"][1]["throughput_rps"] = 150.0
    assert not service_report.targets(entry)["c32_throughput_vs_model_batched"]["passed"]  # 0.79
    # Against the plain ORT server: at least equal at c=1, twice its throughput at c=32.
    entry["servers"]["ort"] = {"levels": [level(1, 50.0, 12.0, 14.0), level(32, 80.0, 300.0, 320.0)]}
    t = service_report.targets(entry)
    assert t["c1_throughput_vs_plain_ort"]["ratio"] == 1.0 and t["c1_throughput_vs_plain_ort"]["passed"]
    assert (
        t["c32_throughput_vs_plain_ort"]["ratio"] == 1.88 and not t["c32_throughput_vs_plain_ort"]["passed"]
    )
    # Without the core count (results from before it was recorded) no ceiling is claimed.
    assert "c32_ceiling_vs_plain_ort" not in t


def test_c32_ceiling_against_the_plain_server_from_cpu_per_request():
    # Two cores; the bare model serves 500 req/s batched: 4 CPU-ms a request.
    ours, peer = level(32, 300.0, 90.0, 95.0, main_ms=1.8), level(32, 200.0, 150.0, 160.0, main_ms=0.8)
    c = service_report.c32_ceiling(ours, peer, model_rps=500.0, cores=2)
    assert c["model_ms"] == 4.0 and c["model_alone"] == 2.5 and c["reachable_by_any_server"]
    assert c["with_peer_event_loop"] == round(2000 / (4.0 + 0.8 + 0.2) / 200, 2) == 2.0  # exactly the target
    assert c["reachable_with_a_fastapi_event_loop"]
    assert c["with_our_event_loop"] == round(2000 / (4.0 + 1.8 + 0.2) / 200, 2) == 1.67
    # Twice the peer is 400 req/s: 5 CPU-ms a request, of which the model takes 4, the client 0.2.
    assert c["event_loop_budget_ms"] == 0.8
    # Tokenizing, which the peer does off its event loop, is paid by any server: with it, 1.96x.
    tok = service_report.c32_ceiling(ours, peer, model_rps=500.0, cores=2, tokenize_ms=0.1)
    assert (
        tok["with_peer_event_loop_and_tokenizing"] == round(2000 / (4.0 + 0.8 + 0.1 + 0.2) / 200, 2) == 1.96
    )
    assert tok["tokenize_ms"] == 0.1 and tok["with_peer_event_loop"] == 2.0
    assert not tok["reachable_with_a_fastapi_event_loop"] and tok["reachable_by_any_server"]
    assert "with_peer_event_loop_and_tokenizing" not in c
    # A model that alone serves less than twice the peer: no server can reach the target.
    slow = service_report.c32_ceiling(ours, peer, model_rps=350.0, cores=2)
    assert slow["model_alone"] == 1.75 and not slow["reachable_by_any_server"]
    assert not slow["reachable_with_a_fastapi_event_loop"] and slow["event_loop_budget_ms"] < 0
    entry = {
        "servers": {"ours": {"levels": [ours]}, "ort": {"levels": [peer]}},
        "model_only": {
            "cores": 2,
            "single_request": {"p50_ms": 1.0, "mean_ms": 1.0},
            "batched": {"requests_per_s": 500.0, "best_batch_size": 8, "best_requests_per_s": 500.0},
            "batched_layout": "2x1",
        },
    }
    assert service_report.targets(entry)["c32_ceiling_vs_plain_ort"] == c


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
    tokenize = tokenize_reference(model, payloads, seconds=0.05)
    assert tokenize["runs"] >= 4 and 0 < tokenize["p50_ms"] <= tokenize["p99_ms"]
    assert single["runs"] >= 4 and 0 < single["p50_ms"] <= single["p99_ms"]
    batched = batched_reference(model, payloads, seconds=0.05, sizes=(1, 4))
    assert batched["reference_batch_size"] == 4 and set(batched["by_batch_size"]) == {1, 4}
    assert batched["requests_per_s"] == batched["by_batch_size"][4]["requests_per_s"] > 0
    assert batched["sequences_per_request"] >= 1
    with pytest.raises(ValueError, match="no 'fp16' variant"):
        BundleModel(regression_bundle, "fp16")  # fp32 + int8 only


def test_batched_reference_runs_instances_side_by_side(tiny_bundles):
    payloads = [make_payload("classify", random.Random(1)) for _ in range(6)]
    model = BundleModel(tiny_bundles["classify"], "fp32", threads=1, instances=2)
    assert len(model.runtimes) == 2 and model.runtimes[0] is not model.runtimes[1]
    batched = batched_reference(model, payloads, seconds=0.05, sizes=(2,))
    assert batched["instances"] == 2 and batched["threads"] == 1
    # Both instances ran: at least one full pass each over the 3 batches.
    assert batched["by_batch_size"][2]["passes"] >= 2 and batched["requests_per_s"] > 0


def test_all_three_real_servers_under_load(tiny_checkpoints, tiny_bundles, tmp_path):
    out = tmp_path / "results"
    code = service_bench.main([
        "--quick", "--endpoints", "classify", "--concurrency", "1,2", "--duration", "0.5", "--warmup", "0.2",
        "--model-seconds", "0.1", "--threads", "1", "--classify-bundle", str(tiny_bundles["classify"]),
        "--classify-checkpoint", str(tiny_checkpoints["classify"]), "--work-dir", str(tmp_path / "work"),
        "--out", str(out), "--ready-timeout", "60",
    ])  # fmt: skip
    assert code == 0
    report = json.loads((out / "service_quick.json").read_text())
    entry = report["endpoints"]["classify"]
    assert set(entry["servers"]) == {"ours", "ours-no-solo", "ours-defaults", "ort", "pipeline"}
    assert entry["servers"]["ort"]["models"]["variant"] == "int8-rowwise"  # the file ours serves
    (ours,) = entry["servers"]["ours"]["models"]["models"]  # our /models answered: the real app served it
    (no_solo,) = entry["servers"]["ours-no-solo"]["models"]["models"]
    assert no_solo["solo_threads"] is None
    loaded = entry["servers"]["ours-defaults"]["models"]["models"]  # every bundle beside the classify one
    assert len(loaded) == len(list(tiny_bundles["classify"].parent.glob("*/bundle.json"))) >= 1
    assert ours["solo_threads"] == (ours["instances"] if available_cores() >= 2 else None)
    for server in entry["servers"].values():
        assert [r["concurrency"] for r in server["levels"]] == [1, 2]
        for row in server["levels"]:
            assert row["ok"] > 0 and row["errors"] == 0 and row["schema_errors"] == 0
            assert row["cpu_seconds_per_1000_requests"] > 0
            split = row["cpu_ms_per_request"]
            assert split["main_thread"] > 0 and split["other_threads"] >= 0 and split["load_generator"] > 0
            assert row["latency_ms"]["p50"] <= row["latency_ms"]["p99"]
    assert entry["model_only"]["single_request"]["p50_ms"] > 0
    assert entry["model_only"]["tokenize"]["mean_ms"] > 0
    # No c=32 level in this run.
    assert set(entry["targets"]) == {"c1_overhead_p50", "c1_overhead_mean", "c1_throughput_vs_plain_ort"}
    assert report["machine"]["versions"]["fastapi"]
    assert (out / "service_quick.png").stat().st_size > 1000
    assert "| pipeline | 2 |" in (out / "service_quick.md").read_text()


def test_recompute_adds_the_ceiling_to_an_earlier_run(tmp_path):
    # The committed run, as it was before the core count and the ceiling were recorded.
    before = json.loads((bench_common.RESULTS / "service.json").read_text())
    for entry in before["endpoints"].values():
        entry["model_only"].pop("cores", None)
        entry["targets"].pop("c32_ceiling_vs_plain_ort", None)
    before.pop("recomputed", None)
    path = tmp_path / "service.json"
    path.write_text(json.dumps(before))
    service_report.main([str(path)])
    after = json.loads(path.read_text())
    classify = after["endpoints"]["classify"]
    ceiling = classify["targets"]["c32_ceiling_vs_plain_ort"]
    best = classify["model_only"]["batched"]["best_requests_per_s"]
    peer32 = {r["concurrency"]: r for r in classify["servers"]["ort"]["levels"]}[32]
    assert ceiling["model_alone"] == round(best / peer32["throughput_rps"], 2)
    assert ceiling["model_ms"] == round(2000 / best, 3)  # that machine's two cores
    # Everything measured is kept as it was.
    assert classify["servers"] == before["endpoints"]["classify"]["servers"]
    text = (tmp_path / "service.md").read_text()
    assert "Targets recomputed from the same measurements" in text and "c32_ceiling_vs_plain_ort" in text


def test_median_round_keeps_whole_rows_and_every_rounds_throughput():
    def run(rps1: float, rps32: float, ready: float) -> dict:
        levels = [level(1, rps1, 1000 / rps1, 1000 / rps1), level(32, rps32, 32000 / rps32, 32000 / rps32)]
        return {"command": ["x"], "ready_seconds": ready, "rss_mb_after_load": ready * 100, "levels": levels}

    merged = service_report.median_round([run(100, 150, 1.0), run(90, 180, 2.0), run(110, 130, 3.0)])
    assert merged["rounds"] == 3 and merged["rss_mb_after_load"] == 300
    c1, c32 = merged["levels"]
    assert c1["throughput_rps"] == 100 and c1["latency_ms"]["p50"] == 10.0  # the row of the median round
    assert c1["throughput_rps_by_round"] == [100, 90, 110]
    assert c32["throughput_rps"] == 150 and c32["throughput_rps_by_round"] == [150, 180, 130]
    # Even counts take the lower middle; one round is returned as it was.
    assert (
        service_report.median_round([run(100, 150, 1), run(90, 180, 2)])["levels"][1]["throughput_rps"] == 150
    )
    single = service_report.median_round([run(100, 150, 1.0)])
    assert single["rounds"] == 1 and "throughput_rps_by_round" not in single["levels"][0]


def test_rounds_alternate_real_servers_and_report_the_median(tiny_bundles, tiny_checkpoints, tmp_path):
    out = tmp_path / "results"
    code = service_bench.main([
        "--endpoints", "classify", "--servers", "ours,ort", "--rounds", "2", "--concurrency", "1",
        "--duration", "0.3", "--warmup", "0.1", "--model-seconds", "0.1", "--threads", "1",
        "--classify-bundle", str(tiny_bundles["classify"]), "--classify-checkpoint",
        str(tiny_checkpoints["classify"]), "--work-dir", str(tmp_path / "work"), "--out", str(out),
        "--name", "rounds", "--ready-timeout", "60",
    ])  # fmt: skip
    assert code == 0
    report = json.loads((out / "rounds.json").read_text())
    assert report["settings"]["rounds"] == 2
    for server in report["endpoints"]["classify"]["servers"].values():
        assert server["rounds"] == 2 and len(server["ready_seconds_by_round"]) == 2
        (row,) = server["levels"]
        assert len(row["throughput_rps_by_round"]) == 2 and row["throughput_rps"] == min(
            row["throughput_rps_by_round"]
        )
    assert "2 rounds, the servers alternating" in (out / "rounds.md").read_text()


def test_ablations_are_our_server_with_settings_alternated_with_the_rest():
    args = service_bench.parse_args(
        ["--servers", "ours", "--ablation", "quiet:LOG_LEVEL=WARNING", "--ablation", "two:A=1,B=x=y"]
    )
    assert args.servers == ["ours", "ours-quiet", "ours-two"]
    assert args.ablations == {"ours-quiet": {"LOG_LEVEL": "WARNING"}, "ours-two": {"A": "1", "B": "x=y"}}
    with pytest.raises(SystemExit):
        service_bench.parse_args(["--ablation", "broken:NOEQUALS"])
    with pytest.raises(SystemExit):  # /embed has no plain ORT peer
        service_bench.parse_args(["--endpoints", "embed", "--servers", "ours,ort"])
