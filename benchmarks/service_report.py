"""What benchmarks/service_bench.py reports: its targets, the ceilings that bound them, the
Markdown table and the plot. Pure functions of the run's report (no servers, no timing), so an
old results JSON can be re-rendered and the arithmetic is tested on hand-made numbers."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common

# Against the plain ORT server on the same file (the targets, /classify).
TARGET_VS_ORT = {1: 1.0, 32: 2.0}
TARGET_C32_FRACTION = 0.85
OVERHEAD_FIXED_MS, OVERHEAD_RELATIVE = 1.0, 0.0
# Every default loaded (`make serve`) against the model alone, the load on that model: c=32.
TARGET_DEFAULTS_FRACTION = 0.95
TARGETS = {
    "c32_fraction_of_model_batched": TARGET_C32_FRACTION,
    "c1_overhead": f"<= {OVERHEAD_FIXED_MS} ms + {OVERHEAD_RELATIVE:.0%} of model-only",
    "throughput_vs_plain_ort": {f"c{level}": ratio for level, ratio in TARGET_VS_ORT.items()},
    "c32_defaults_loaded_vs_alone": TARGET_DEFAULTS_FRACTION,
}


def median_round(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's result over rounds: at each concurrency level, the whole row of the round with
    the median throughput (the lower middle for an even count), so its latencies and CPU split
    belong to one measurement, with every round's throughput beside it."""
    merged = {**runs[0], "rounds": len(runs)}
    if len(runs) == 1:
        return merged
    levels = []
    for rows in zip(*(run["levels"] for run in runs), strict=True):
        ranked = sorted(rows, key=lambda row: row["throughput_rps"])
        levels.append(
            {**ranked[(len(ranked) - 1) // 2], "throughput_rps_by_round": [r["throughput_rps"] for r in rows]}
        )
    merged["levels"] = levels
    merged["ready_seconds_by_round"] = [run["ready_seconds"] for run in runs]
    merged["rss_mb_after_load"] = max(run["rss_mb_after_load"] for run in runs)
    return merged


def targets(entry: dict[str, Any], cores: int | None = None) -> dict[str, Any]:
    """The service targets, computed from our server's rows, the plain ORT server's and the
    model-only references, and the ceiling that bounds the c=32 target against the plain server
    (given the cores the batched references used: recorded in the run, or passed)."""
    ours = {r["concurrency"]: r for r in entry["servers"]["ours"]["levels"]}
    ref, out = entry["model_only"], {}
    cores = ref.get("cores") or cores
    best = ref["batched"]["best_requests_per_s"]
    if 32 in ours and best:
        fraction = ours[32]["throughput_rps"] / best
        out["c32_throughput_vs_model_batched"] = {
            "service_rps": ours[32]["throughput_rps"],
            "model_batched_rps": best,
            "model_layout": ref["batched_layout"],
            "model_batch_size": ref["batched"]["best_batch_size"],
            "fraction": round(fraction, 3),
            "target": TARGET_C32_FRACTION,
            "passed": fraction >= TARGET_C32_FRACTION,
        }
    if 1 in ours and ours[1]["latency_ms"]["p50"] is not None:
        single = ref["single_request"]
        for stat, service in (("p50", ours[1]["latency_ms"]["p50"]), ("mean", ours[1]["latency_ms"]["mean"])):
            model_ms = single[f"{stat}_ms"]
            allowed = OVERHEAD_FIXED_MS + (1 + OVERHEAD_RELATIVE) * model_ms
            out[f"c1_overhead_{stat}"] = {
                "service_ms": service,
                "model_only_ms": model_ms,
                "overhead_ms": round(service - model_ms, 3),
                "allowed_ms": round(allowed, 3),
                "passed": service <= allowed,
            }
    peer = {r["concurrency"]: r for r in entry["servers"].get("ort", {}).get("levels", [])}
    for level, wanted in TARGET_VS_ORT.items():
        if level in ours and level in peer and peer[level]["throughput_rps"]:
            ratio = ours[level]["throughput_rps"] / peer[level]["throughput_rps"]
            out[f"c{level}_throughput_vs_plain_ort"] = {
                "ours_rps": ours[level]["throughput_rps"],
                "plain_ort_rps": peer[level]["throughput_rps"],
                "ratio": round(ratio, 2),
                "target": wanted,
                "passed": ratio >= wanted,
            }
    loaded = {r["concurrency"]: r for r in entry["servers"].get("ours-defaults", {}).get("levels", [])}
    if 32 in ours and 32 in loaded and ours[32]["throughput_rps"]:
        fraction = loaded[32]["throughput_rps"] / ours[32]["throughput_rps"]
        out["c32_defaults_loaded_vs_alone"] = {
            "alone_rps": ours[32]["throughput_rps"],
            "defaults_loaded_rps": loaded[32]["throughput_rps"],
            "fraction": round(fraction, 3),
            "target": TARGET_DEFAULTS_FRACTION,
            "passed": fraction >= TARGET_DEFAULTS_FRACTION,
        }
    measured = 32 in ours and 32 in peer and all("cpu_ms_per_request" in r for r in (ours[32], peer[32]))
    if measured and best and cores:  # runs before the CPU split or the core count was recorded: none
        tokenize_ms = ref.get("tokenize", {}).get("mean_ms")  # runs before it was measured: None
        out["c32_ceiling_vs_plain_ort"] = c32_ceiling(ours[32], peer[32], best, cores, tokenize_ms)
    return out


def c32_ceiling(
    ours: dict[str, Any],
    peer: dict[str, Any],
    model_rps: float,
    cores: int,
    tokenize_ms: float | None = None,
) -> dict[str, Any]:
    """The most any server could serve against the plain ORT server at c=32, from CPU per request
    measured in the same run: the cores' CPU-ms per second over the bare model's cost (its best
    batched throughput spread over every core) plus an event loop's and the load generator's.

    `model_alone` has no server at all; `with_peer_event_loop` adds what the plain server's main
    thread (FastAPI and uvicorn with nothing of ours: no tokenizing, batching or logging) spends
    per request, and `with_peer_event_loop_and_tokenizing` also the service's tokenizing alone
    (measured on the same payloads; the peer does it on its worker threads, any server pays it);
    `with_our_event_loop` adds ours. `event_loop_budget_ms` is what the target leaves an event
    loop with inference at the bare model's cost."""
    wanted, budget = TARGET_VS_ORT[32], 1000.0 * cores
    peer_rps = peer["throughput_rps"]
    model_ms = budget / model_rps
    load_ms = ours["cpu_ms_per_request"]["load_generator"]
    our_loop_ms = ours["cpu_ms_per_request"]["main_thread"]
    peer_loop_ms = peer["cpu_ms_per_request"]["main_thread"]

    def ratio(other_ms: float) -> float:
        return round(budget / (model_ms + other_ms) / peer_rps, 2)

    model_alone = round(model_rps / peer_rps, 2)
    with_peer_loop = ratio(peer_loop_ms + load_ms)
    leanest = with_peer_loop  # the leanest FastAPI server measured: with tokenizing where known
    tokenizing: dict[str, Any] = {}
    if tokenize_ms is not None:
        leanest = ratio(peer_loop_ms + tokenize_ms + load_ms)
        tokenizing = {"with_peer_event_loop_and_tokenizing": leanest, "tokenize_ms": tokenize_ms}
    return {
        "target": wanted,
        "model_alone": model_alone,
        "with_peer_event_loop": with_peer_loop,
        **tokenizing,
        "with_our_event_loop": ratio(our_loop_ms + load_ms),
        "model_ms": round(model_ms, 3),
        "load_generator_ms": load_ms,
        "peer_event_loop_ms": peer_loop_ms,
        "our_event_loop_ms": our_loop_ms,
        "event_loop_budget_ms": round(budget / (wanted * peer_rps) - model_ms - load_ms, 3),
        "reachable_by_any_server": model_alone >= wanted,
        "reachable_with_a_fastapi_event_loop": leanest >= wanted,
    }


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        "# Service vs a plain ONNX Runtime server and a transformers-pipeline server",
        "",
        f"Generated {report['created_at']} by `{s['command']}`."
        + (
            f" Targets recomputed from the same measurements {report['recomputed']['at']} by "
            f"`{report['recomputed']['command']}`."
            if "recomputed" in report
            else ""
        ),
        "",
        f"- Machine: {common.machine_line(report['machine'])}",
        f"- Closed loop (benchmarks/loadgen.py), {s['duration_s']} s per level after "
        f"{s['warmup_s']} s warm-up, seed {s['seed']}; our server: CPU_VARIANT={s['cpu_variant']}, "
        f"INTRA_OP_THREADS={s['threads']} MODEL_INSTANCES={s.get('instances', 0)} "
        f"{' '.join(f'{k}={v}' for k, v in s['server_env'].items())}; "
        "load generator in the same machine."
        + (
            f" {s['rounds']} rounds, the servers alternating; each row is the level's median round, "
            "with the rounds' range of req/s in brackets."
            if s.get("rounds", 1) > 1
            else ""
        ),
        "",
    ]
    for name, entry in report["endpoints"].items():
        lines += [
            f"## /{name}",
            "",
            f"Bundle `{entry['bundle']}` (ours and `ort` serve the same file); `pipeline` baseline "
            f"checkpoint `{entry['checkpoint']}` ({entry['checkpoint_source']}).",
            "",
            "| server | concurrency | req/s | p50 ms | p99 ms | errors | CPU-s / 1k req "
            "| CPU ms/req: main thread / other threads / load generator |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for server_name, result in entry["servers"].items():
            for r in result["levels"]:
                lat = r["latency_ms"]
                spread = r.get("throughput_rps_by_round")
                rps = f"{r['throughput_rps']:.1f}" + (
                    f" ({min(spread):.1f}–{max(spread):.1f})" if spread else ""
                )
                lines.append(
                    f"| {server_name} | {r['concurrency']} | {rps} | {lat['p50']} | "
                    f"{lat['p99']} | {r['errors']} | {r['cpu_seconds_per_1000_requests']} | "
                    + " / ".join(str(v) for v in r.get("cpu_ms_per_request", {}).values())
                    + " |"
                )
        ref = entry["model_only"]
        lines += [
            "",
            f"Model-only ORT ({ref['variant']}); one request alone on the server's session "
            f"({ref['threads']} threads): p50 {ref['single_request']['p50_ms']} ms, "
            f"mean {ref['single_request']['mean_ms']} ms. Length-sorted full batches "
            f"({ref['batched']['sequences_per_request']} sequences per request), by layout "
            "(sessions x threads each):",
            "",
        ]
        for layout, batched in ref["batched_by_layout"].items():
            lines.append(
                f"- {layout}: "
                + ", ".join(
                    f"batch {size}: {r['requests_per_s']} req/s"
                    for size, r in batched["by_batch_size"].items()
                )
            )
        lines.append("")
        for key, t in entry["targets"].items():
            lines.append(f"- {key}: " + ", ".join(f"{k} {v}" for k, v in t.items()))
        lines.append("")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    names = list(report["endpoints"])
    fig, axes = plt.subplots(len(names), 2, figsize=(12, 4.2 * len(names)), squeeze=False)
    for row, name in zip(axes, names, strict=True):
        entry = report["endpoints"][name]
        for i, (server_name, result) in enumerate(entry["servers"].items()):
            levels, color = result["levels"], f"C{i}"  # one colour per server in both panels
            c = [r["concurrency"] for r in levels]
            row[0].plot(c, [r["throughput_rps"] for r in levels], "o-", color=color, label=server_name)
            for stat, style in (("p50", "o-"), ("p99", "x--")):
                values = [r["latency_ms"][stat] or float("nan") for r in levels]
                row[1].plot(c, values, style, color=color, label=f"{server_name} {stat}")
        best = entry["model_only"]["batched"]
        row[0].axhline(
            best["best_requests_per_s"],
            color="grey",
            ls=":",
            label=f"model-only ORT, best: batches of {best['best_batch_size']}, "
            f"{entry['model_only'].get('batched_layout', '')} sessions x threads",
        )
        row[1].axhline(
            entry["model_only"]["single_request"]["p50_ms"],
            color="grey",
            ls=":",
            label="model-only single request (p50)",
        )
        for ax, ylabel in zip(row, ("requests/s", "latency, ms (log)"), strict=True):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency (closed loop)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"/{name}")
            ax.legend(fontsize=8)
        row[1].set_yscale("log")
    fig.suptitle(f"Service vs plain ORT and transformers servers: {common.cpu_label(report['machine'])}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def recompute(path: Path) -> None:
    """Recompute an earlier run's targets (and rewrite its Markdown) from its own measurements,
    with this module's arithmetic. Its batched references used every core of the machine."""
    report = json.loads(path.read_text(encoding="utf-8"))
    cores = report["machine"]["logical_cores"]
    for entry in report["endpoints"].values():
        if "ours" in entry["servers"]:
            entry["targets"] = targets(entry, cores)
    report["recomputed"] = {
        "at": common.now(),
        "command": f"python -m benchmarks.service_report {common.repo_relative(str(path))}",
    }
    common.write_results(path.parent, path.stem, report, markdown(report), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=recompute.__doc__)
    parser.add_argument("results", type=Path, nargs="+", help="a service_bench results JSON")
    for path in parser.parse_args(argv).results:
        recompute(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
