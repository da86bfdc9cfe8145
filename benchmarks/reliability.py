"""What faults.py, model_swap.py and soak.py share: load with a scenario running beside it that
marks its events, the per-second timeline of the answers, and the PASS/FAIL report around them."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks.loadgen import percentiles

Row = tuple[float, float | None, bool, str | None]  # (s since the start, latency s, ok, tag e.g. a version)


class Run:
    """One stretch of load, timed from one start: its clients' samples as they arrive, its events, and
    (once over) its requests as Rows."""

    def __init__(self, name: str = "") -> None:
        self.name, self.started = name, time.perf_counter()
        self.samples: list[Any] = []
        self.rows: list[Row] = []
        self.events: list[dict[str, Any]] = []

    def t(self) -> float:
        return round(time.perf_counter() - self.started, 3)

    def event(self, what: str, **info: Any) -> dict[str, Any]:
        self.events.append({"t_s": self.t(), "event": what, **info})
        print(f"  {self.name} t={self.events[-1]['t_s']:.1f}s {what}", flush=True)
        return self.events[-1]

    def latency_within(self, windows: list[tuple[float, float]]) -> dict[str, Any]:
        """Latency percentiles (ms) of the answers sent inside any of `windows` (s since the start)."""
        inside = [r[1] for r in self.rows if r[1] is not None and any(a <= r[0] <= b for a, b in windows)]
        return {**percentiles(inside), "requests": len(inside)}

    def timeline(self, width_s: float = 1.0) -> list[dict[str, Any]]:
        """Per `width_s` of send time: requests, failures, p50/p99 ms, and answers per second by tag."""
        bins: dict[int, list[Row]] = {}
        for row in self.rows:
            bins.setdefault(int(row[0] // width_s), []).append(row)
        out = []
        for i, rows in sorted(bins.items()):
            stats = percentiles([r[1] for r in rows if r[1] is not None])
            tags = Counter(r[3] for r in rows if r[2] and r[3] is not None)
            failed = sum(not r[2] for r in rows)
            out.append({"t_s": round(i * width_s, 3), "requests": len(rows), "failed": failed,
                        "p50_ms": stats["p50"], "p99_ms": stats["p99"]})  # fmt: skip
            if tags:
                out[-1]["answers_per_s"] = {k: n / width_s for k, n in sorted(tags.items())}
        return out


async def under_load(
    run: Run, load: Callable[[asyncio.Event], Awaitable[Any]], scenario: Callable[[Run], Awaitable[None]],
    tail_s: float = 0.0,
) -> Any:  # fmt: skip
    """Start `load(stop)`, run `scenario` beside it, keep the load on `tail_s` more, stop it: its result."""
    stop = asyncio.Event()
    task = asyncio.ensure_future(load(stop))
    try:
        await scenario(run)
        await asyncio.sleep(tail_s)
    finally:
        stop.set()
        result = await task  # also when the scenario failed: no load left running
    return result


def plot_timeline(ax: Any, bins: list[dict[str, Any]], events: list[dict[str, Any]], title: str) -> None:
    """p50/p99 per bin on a log scale, seconds with failures marked, each event a labelled line."""
    t = [b["t_s"] for b in bins]
    ax.plot(t, [b["p50_ms"] for b in bins], label="p50")
    ax.plot(t, [b["p99_ms"] for b in bins], label="p99")
    failed = [(b["t_s"], b["p99_ms"] or 1) for b in bins if b["failed"]]
    if failed:
        ax.scatter(*zip(*failed, strict=True), s=24, c="red", marker="x", label="a bin with failures")
    for i, e in enumerate(events):  # labels staggered: events often come in pairs
        ax.axvline(e["t_s"], color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(e["event"], (e["t_s"], 0.98 if i % 2 == 0 else 0.45), xycoords=("data", "axes fraction"),
                    rotation=90, va="top", ha="right", fontsize=7)  # fmt: skip
    ax.set(yscale="log", xlabel="seconds since the start (request sent)", ylabel="latency, ms", title=title)
    ax.legend(loc="lower right", fontsize=7)


def markdown(title: str, report: dict[str, Any], body: list[str]) -> str:
    """The frame of every report: verdict, command, machine, the body, then each check."""
    checks = ", ".join(f"{k} {'✓' if v else '✗'}" for k, v in report["checks"].items())
    verdict = "PASS" if all(report["checks"].values()) else "FAIL"
    head = f"`{report['command']}` on {report['date']}. Machine: {common.machine_line(report['machine'])}."
    return "\n".join([f"# {title}: {verdict}", "", head, "", *body, "", f"Checks: {checks}."])


def finish(out: Path, name: str, report: dict[str, Any], text: str, plot: Callable[[Path], None]) -> int:
    """Write the results; exit status 0 only when every check held."""
    report["passed"] = all(report["checks"].values())
    common.write_results(out, name, report, text, plot)
    failed = [k for k, v in report["checks"].items() if not v]
    print(text.splitlines()[0], "—", f"failed: {', '.join(failed)}" if failed else "every check held")
    return 0 if report["passed"] else 1
