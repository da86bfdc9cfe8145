"""The tables and the plot of benchmarks/peers.py: medians over rounds, ratios to the fastest peer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import bench_common as common

# Workloads per task and the floors (references, never "the fastest peer"); peers.py runs them.
WORKLOADS = {
    "embed": [("embed", 1), ("embed", 32), ("embed-32", 4)],
    "classify": [("classify-25w", 1), ("classify-25w", 32)],
}
FLOORS = ("ort", "pipeline", "st")


COLUMNS = [(task, i) for task in WORKLOADS for i in range(len(WORKLOADS[task]))]
TITLES = {"embed": "emb c=1", "embed-32": "emb 32 texts/req", "classify-25w": "classify"}


def title(task: str, i: int) -> str:
    endpoint, concurrency = WORKLOADS[task][i]
    return f"{TITLES[endpoint].removesuffix(' c=1')} c={concurrency}"


def cell(report: dict[str, Any], name: str, task: str, i: int) -> dict[str, Any] | None:
    entry = report["tasks"].get(task, {}).get(name, {})
    return entry["levels"][i] if "levels" in entry else None


def fastest_peer(report: dict[str, Any], task: str, i: int) -> float | None:
    """The best median throughput of the real peers (neither ours nor a floor) on one workload."""
    rates = [
        c["rps"]
        for n in report["servers"]
        if n != "ours" and n not in FLOORS
        for c in [cell(report, n, task, i)]
        if c and c["rps"]
    ]
    return max(rates) if rates else None


def markdown(report: dict[str, Any]) -> str:
    columns = [c for c in COLUMNS if c[0] in report["tasks"]]
    head = "| server | " + " | ".join(title(*c) for c in columns) + " |\n|---|" + "---:|" * len(columns)
    lines = [
        "# Our service against its peers",
        "",
        f"    {report['command']}",
        "",
        f"{common.machine_line(report['machine'])}; load average at end {report['load_average_at_end']}.",
        f"{report['settings']['rounds']} alternating rounds of {report['settings']['duration']} s per level; "
        "medians over the rounds, [min–max] in brackets. Closed loop, loadgen in its own process.",
        "",
        "## Requests per second, and p50 at c=1",
        "",
        head,
    ]

    def rates(c: dict, task: str, i: int) -> str:
        text = f"{c['rps']:.1f} [{c['rps_range'][0]:.0f}–{c['rps_range'][1]:.0f}]"
        return text + (f", p50 {c['p50_ms']:.1f} ms" if WORKLOADS[task][i][1] == 1 else "")

    def ratio(c: dict, task: str, i: int) -> str:
        best = fastest_peer(report, task, i)
        return f"{c['rps'] / best:.2f}" if best else "—"

    def cpu(c: dict, task: str, i: int) -> str:
        return f"{c['server_cpu_ms_per_request']:.2f}" if c["server_cpu_ms_per_request"] else "—"

    sections = {
        "Throughput as a ratio to the fastest peer (floors and ours excluded from 'fastest')": ratio,
        "Server CPU, ms per request (median over rounds)": cpu,
    }
    for heading, show in [("", rates), *sections.items()]:
        lines += ["", f"## {heading}", "", head] if heading else []
        for name in report["servers"]:
            cells = [(cell(report, name, *c), *c) for c in columns]
            lines.append(f"| {name} | " + " | ".join(show(*c) if c[0] else "—" for c in cells) + " |")
    lines += [
        "",
        "## Answers against ours",
        "",
        "Embeddings: cosine with ours over 12 sentences (must be >= 0.99); classify: labels agreeing "
        "over 12 texts and the largest gap in the top score (< 0.1: ours is INT8, most peers fp32).",
        "",
        "| server | task | answers | errors |",
        "|---|---|---|---:|",
    ]
    failed = []
    for task, entries in report["tasks"].items():
        for name, entry in entries.items():
            if "error" in entry:
                lines_of = [line.strip() for line in entry["error"].splitlines() if line.strip()]
                failed.append(f"- **{name}** ({task}): {lines_of[0]} … {lines_of[-1]}")
            elif name != "ours":
                errors = sum(level["errors"] for level in entry["levels"])
                lines.append(f"| {name} | {task} | {entry.get('answers')} | {errors} |")
    lines += ["", "## Servers", ""] + [f"- **{n}**: {what}" for n, what in report["servers"].items()]
    lines += ["", "Versions: " + "; ".join(f"{env}: {v}" for env, v in report["versions"].items())]
    if failed:
        lines += ["", "## Could not run", ""] + failed
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    columns = [c for c in COLUMNS if c[0] in report["tasks"]]
    names = [n for n in report["servers"] if any(cell(report, n, *c) for c in columns)]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        values = []
        for task, i in columns:
            c, best = cell(report, name, task, i), fastest_peer(report, task, i)
            values.append(c["rps"] / best if c and best else 0)
        ax.bar([j + k * width for j in range(len(columns))], values, width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(columns))], [title(*c) for c in columns])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("throughput / fastest peer's")
    ax.set_title("Median throughput over alternating rounds, relative to the fastest real peer")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
