"""What benchmarks/service_bench.py reports: the targets, the Markdown tables and the plot.
Pure functions of the run's report (no servers, no timing), tested on hand-made numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import bench_common as common

# Issue 30: against the bare model, with every default loaded, and against the fastest real peer.
TARGETS = {
    "c32_fraction_of_model_batched": 0.85,  # c=32 throughput / the bare model's best batched throughput
    "c1_p50_overhead_ms": 1.0,  # c=1 p50 <= bare model's p50 + this
    "c32_defaults_loaded_vs_alone": 0.95,  # c=32 with every default loaded / alone
    "vs_fastest_peer": {"32": 1.5, "1": 1.0, "embed-32": 1.0},  # c=32, c=1, 32 texts/request
}
FLOORS = ("ort", "pipeline", "st")  # references in this environment, never "the fastest peer"


def is_peer(name: str) -> bool:
    return not name.startswith("ours") and name not in FLOORS


def median_round(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One server over rounds: at each level the whole row of the round with the median throughput
    (the lower middle for an even count), so its latencies and CPU belong to one measurement,
    with every round's throughput beside it. A server that never ran keeps its error."""
    good = [run for run in runs if "levels" in run]
    if not good:
        return {"error": runs[-1].get("error", "no round ran")}
    levels = []
    for rows in zip(*(run["levels"] for run in good), strict=True):
        ranked = sorted(rows, key=lambda row: row["throughput_rps"])
        rates = [r["throughput_rps"] for r in rows]
        levels.append({**ranked[(len(ranked) - 1) // 2], "throughput_rps_by_round": rates})
    return {
        **good[0],
        "rounds": len(good),
        "levels": levels,
        "ready_seconds_by_round": [run["ready_seconds"] for run in good],
        "rss_mb_after_load": max(run["rss_mb_after_load"] for run in good),
    }


def key(row: dict[str, Any]) -> str:
    return f"{row.get('workload', '')} c={row['concurrency']}"


def fastest_peer(entry: dict[str, Any], row_key: str) -> tuple[str, float] | None:
    """The real peer (neither ours nor a floor) with the best median throughput on one workload."""
    rates = [
        (name, row["throughput_rps"])
        for name, result in entry["servers"].items()
        if is_peer(name)
        for row in result.get("levels", [])
        if key(row) == row_key and row["throughput_rps"]
    ]
    return max(rates, key=lambda rate: rate[1]) if rates else None


def targets(entry: dict[str, Any]) -> dict[str, Any]:
    """The issue-30 targets from our rows, the bare model's and the peers' (those measured)."""
    out: dict[str, Any] = {}
    rows = entry["servers"].get("ours", {}).get("levels", [])
    ours = {r["concurrency"]: r for r in rows if "-" not in r.get("workload", "")}  # the endpoint's own
    ref = entry.get("model_only")
    if ref and 32 in ours and ref["batched"]["best_requests_per_s"]:
        best = ref["batched"]["best_requests_per_s"]
        fraction = ours[32]["throughput_rps"] / best
        out["c32_throughput_vs_model_batched"] = {
            "service_rps": ours[32]["throughput_rps"],
            "model_batched_rps": best,
            "model_layout": ref["batched_layout"],
            "model_batch_size": ref["batched"]["best_batch_size"],
            "fraction": round(fraction, 3),
            "target": TARGETS["c32_fraction_of_model_batched"],
            "passed": fraction >= TARGETS["c32_fraction_of_model_batched"],
        }
    if ref and 1 in ours and ours[1]["latency_ms"]["p50"] is not None:
        service, model_ms = ours[1]["latency_ms"]["p50"], ref["single_request"]["p50_ms"]
        out["c1_overhead_p50"] = {
            "service_ms": service,
            "model_only_ms": model_ms,
            "overhead_ms": round(service - model_ms, 3),
            "allowed_ms": round(model_ms + TARGETS["c1_p50_overhead_ms"], 3),
            "passed": service <= model_ms + TARGETS["c1_p50_overhead_ms"],
        }
    loaded = {r["concurrency"]: r for r in entry["servers"].get("ours-defaults", {}).get("levels", [])}
    if 32 in ours and 32 in loaded and ours[32]["throughput_rps"]:
        fraction = loaded[32]["throughput_rps"] / ours[32]["throughput_rps"]
        out["c32_defaults_loaded_vs_alone"] = {
            "alone_rps": ours[32]["throughput_rps"],
            "defaults_loaded_rps": loaded[32]["throughput_rps"],
            "fraction": round(fraction, 3),
            "target": TARGETS["c32_defaults_loaded_vs_alone"],
            "passed": fraction >= TARGETS["c32_defaults_loaded_vs_alone"],
        }
    for row in rows:
        workload = "embed-32" if row.get("workload") == "embed-32" else str(row["concurrency"])
        wanted = TARGETS["vs_fastest_peer"].get(workload)
        peer = fastest_peer(entry, key(row))
        if wanted is None or peer is None:
            continue
        ratio = row["throughput_rps"] / peer[1]
        out[f"{key(row)} vs fastest peer"] = {
            "ours_rps": row["throughput_rps"],
            "peer": peer[0],
            "peer_rps": peer[1],
            "ratio": round(ratio, 2),
            "target": wanted,
            "passed": ratio >= wanted,
        }
    return out


def extras(row: dict[str, Any]) -> str:
    """Our own counters over the level: the response cache's hit rate, the batches' mean size and
    the padded tokens per request."""
    names = {
        "cache_hit_rate": "cache hits",
        "mean_batch_size": "mean batch",
        "padded_tokens_per_request": "padded/req",
    }
    return ", ".join(
        f"{label} {row[k]:.0%}" if k == "cache_hit_rate" else f"{label} {row[k]}"
        for k, label in names.items()
        if k in row
    )


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        "# The service against its bare model and its peers",
        "",
        f"    {s['command']}",
        "",
        f"Generated {report['created_at']}. {common.machine_line(report['machine'])}; load average at end "
        f"{report.get('load_average_at_end')}. Closed loop (benchmarks/loadgen.py, in the benchmark's "
        f"process), {s['duration']} s per level after {s['warmup']} s warm-up; our server and the bare "
        f"model run {s['variant']}. {s['rounds']} rounds, the servers alternating; each row is the "
        "level's median round, with the rounds' range of req/s in brackets.",
    ]
    failed = []
    for endpoint, entry in report["endpoints"].items():
        lines += [
            "",
            f"## /{endpoint}",
            "",
            f"Bundle `{entry['bundle']}`"
            + (
                f"; checkpoint `{entry['checkpoint']}` ({entry['checkpoint_source']})."
                if "checkpoint" in entry
                else "."
            ),
            "",
            "| server | workload | req/s | vs fastest peer | p50 ms | p99 ms | errors "
            "| CPU ms/req: main thread / other threads / load generator | answers vs ours; our counters |",
            "|---|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for name, result in entry["servers"].items():
            if "error" in result:
                text = [line.strip() for line in result["error"].splitlines() if line.strip()] or ["?"]
                failed.append(f"- **{name}** (/{endpoint}): {text[0]} … {text[-1]}")
                continue
            answers = ", ".join(f"{k} {v}" for k, v in (result.get("answers") or {}).items())
            for r in result["levels"]:
                lat, peer = r["latency_ms"], fastest_peer(entry, key(r))
                lo, hi = min(r["throughput_rps_by_round"]), max(r["throughput_rps_by_round"])
                lines.append(
                    f"| {name} | {key(r)} | {r['throughput_rps']:.1f} ({lo:.1f}–{hi:.1f}) | "
                    + (f"{r['throughput_rps'] / peer[1]:.2f}" if peer else "—")
                    + f" | {lat['p50']} | {lat['p99']} | {r['errors']} | "
                    + " / ".join(str(v) for v in r["cpu_ms_per_request"].values())
                    + f" | {'; '.join(filter(None, [answers, extras(r)]))} |"
                )
        ref = entry.get("model_only")
        if ref:
            lines += [
                "",
                f"Bare model ({ref['variant']}); one request alone on the session the server runs it on "
                f"({ref['single_request_threads']} threads): p50 "
                f"{ref['single_request']['p50_ms']} ms. Length-sorted full "
                f"batches ({ref['batched']['sequences_per_request']} sequences per request), by layout "
                "(sessions x threads each):",
                "",
            ]
            for layout, batched in ref["batched_by_layout"].items():
                sizes = batched["by_batch_size"].items()
                lines.append(
                    f"- {layout}: " + ", ".join(f"batch {k}: {r['requests_per_s']} req/s" for k, r in sizes)
                )
        lines.append("")
        for name, t in entry["targets"].items():
            lines.append(f"- {name}: " + ", ".join(f"{k} {v}" for k, v in t.items()))
    lines += ["", "## Servers", ""] + [f"- **{n}**: {what}" for n, what in report["servers"].items()]
    if report.get("versions"):
        lines += ["", "Versions: " + "; ".join(f"{env}: {v}" for env, v in report["versions"].items())]
    if failed:
        lines += ["", "## Could not run", ""] + failed
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Per endpoint: throughput and p50 of every server at each workload, the bare model's lines."""
    names = list(report["endpoints"])
    fig, axes = common.pyplot().subplots(len(names), 2, figsize=(12, 4.2 * len(names)), squeeze=False)
    for row, endpoint in zip(axes, names, strict=True):
        entry = report["endpoints"][endpoint]
        servers = {n: r for n, r in entry["servers"].items() if "levels" in r}
        workloads = list(dict.fromkeys(key(r) for result in servers.values() for r in result["levels"]))
        width = 0.8 / max(len(servers), 1)
        for k, (name, result) in enumerate(servers.items()):
            by_key = {key(r): r for r in result["levels"]}
            xs = [j + k * width for j in range(len(workloads))]
            rows = [by_key.get(w, {"throughput_rps": 0, "latency_ms": {"p50": 0}}) for w in workloads]
            row[0].bar(xs, [r["throughput_rps"] for r in rows], width, label=name, color=f"C{k}")
            row[1].bar(xs, [r["latency_ms"]["p50"] or 0 for r in rows], width, label=name, color=f"C{k}")
        if ref := entry.get("model_only"):
            row[0].axhline(ref["batched"]["best_requests_per_s"], color="grey", ls=":", label="bare, batched")
            row[1].axhline(ref["single_request"]["p50_ms"], color="grey", ls=":", label="bare, one request")
        for ax, ylabel in zip(row, ("requests/s", "p50 latency, ms (log)"), strict=True):
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))], workloads)
            ax.set_ylabel(ylabel)
            ax.set_title(f"/{endpoint}")
            ax.legend(fontsize=7, ncol=2)
        row[1].set_yscale("log")
    fig.suptitle(f"Service vs bare model and peers: {common.cpu_label(report['machine'])}")
    common.save_figure(fig, path)
