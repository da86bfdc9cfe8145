"""/embed throughput: our service against a plain FastAPI server wrapping sentence-transformers.

    python -m benchmarks.embed_bench [--duration 10] [--servers ours,ours-fp32,st]

One server at a time on loopback, the same MiniLM folder: `ours` is `uvicorn app.main:app` on the
embedding default alone with its default settings (int8-rowwise on a CPU) but MAX_QUEUE=2048
(--max-queue: at 32 clients x 32 texts, 1,024 texts wait, and the default 512 answers the excess
429 at once); `ours-fp32` the same
with CPU_VARIANT=fp32 (the like-for-like precision); `st` is benchmarks/st_server.py (one
SentenceTransformer, `model.encode` per request, torch's default threads). For each, closed-loop
clients (benchmarks/rawhttp.py, keep-alive) at concurrency 1 and 32, sending 1 or 32 texts per
request, drawn in turn from the 200 varied sentences of benchmarks/embed_data.py; every answer's
status is checked. Reported: requests/s, texts/s, p50/p99 latency, server CPU-seconds per 1,000
texts. Writes benchmarks/results/embed_bench.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks import rawhttp
from benchmarks.embed_data import varied_sentences
from benchmarks.embed_quality import serve_variant

STEM = "embed_bench"
LEVELS = [(1, 1), (1, 32), (32, 1), (32, 32)]  # (concurrency, texts per request)


def bodies(sentences: list[str], per_request: int, n: int = 64) -> list[bytes]:
    """`n` request bodies of `per_request` texts each, taken in turn from `sentences`."""
    out, cursor = [], 0
    for _ in range(n):
        texts = [sentences[(cursor + i) % len(sentences)] for i in range(per_request)]
        cursor += per_request
        out.append(json.dumps({"inputs": texts}).encode())
    return out


async def closed_loop(url: str, payloads: list[bytes], concurrency: int, duration: float) -> dict[str, Any]:
    host, port = rawhttp.host_port(url)
    pools = [rawhttp.ConnectionPool(host, port) for _ in range(concurrency)]
    raws = [rawhttp.encode_request("POST", "/embed", b, {}, f"{host}:{port}") for b in payloads]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    started = time.perf_counter()

    async def worker(w: int) -> None:
        i = w
        while time.perf_counter() - started < duration:
            sent = time.perf_counter()
            try:
                response = await pools[w].request(raws[i % len(raws)], timeout_s=120)
                status = str(response.status)
            except (rawhttp.HTTPError, asyncio.TimeoutError) as e:
                status = type(e).__name__
            if status == "200":
                latencies.append(time.perf_counter() - sent)
            else:
                errors[status] = errors.get(status, 0) + 1
            i += concurrency

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - started
    for pool in pools:
        await pool.close()
    latencies.sort()
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3, 1)  # noqa: E731
    return {
        "ok": len(latencies),
        "errors": errors,
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(len(latencies) / elapsed, 2),
        "p50_ms": pick(0.5) if latencies else None,
        "p99_ms": pick(0.99) if latencies else None,
        "mean_ms": round(statistics.mean(latencies) * 1e3, 1) if latencies else None,
    }


def peer_server(model: str, work: Path):
    port = common.free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "benchmarks.st_server", "--model", model, "--port", str(port)]
    return url, common.server(command, {}, work / "st.log", url, ready_timeout=300)


def run_server(name: str, url: str, pid: int, sentences: list[str], args: argparse.Namespace) -> list[dict]:
    asyncio.run(closed_loop(url, bodies(sentences, 32), 4, args.warmup))  # warm-up: every length seen
    rows = []
    for concurrency, per_request in LEVELS:
        cpu_before = common.tree_cpu_seconds(pid)
        result = asyncio.run(closed_loop(url, bodies(sentences, per_request), concurrency, args.duration))
        cpu = common.tree_cpu_seconds(pid) - cpu_before
        texts = result["ok"] * per_request
        row = {
            "server": name,
            "concurrency": concurrency,
            "texts_per_request": per_request,
            **result,
            "texts_per_s": round(texts / result["elapsed_s"], 1),
            "cpu_seconds_per_1000_texts": round(1000 * cpu / texts, 2) if texts else None,
        }
        rows.append(row)
        print(
            f"  {name:9s} c={concurrency:<2} x{per_request:<2} {row['requests_per_s']:8.2f} req/s "
            f"{row['texts_per_s']:8.1f} texts/s  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  "
            f"errors {row['errors']}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bundle", type=Path, default=common.ROOT / ".cache" / "bundles" / "all-minilm-l6-v2"
    )
    parser.add_argument("--model", default="minilm", help="the sentence-transformers folder for the peer")
    parser.add_argument("--data", type=Path, default=common.ROOT.parent / "shared" / "data")
    parser.add_argument("--servers", default="ours,ours-fp32,st")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per level")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--max-queue",
        type=int,
        default=2048,
        help="our MAX_QUEUE: 32 clients x 32 texts keep 1,024 texts queued, beyond the default 512, which "
        "would answer part of them 429 at once instead of measuring throughput",
    )
    parser.add_argument("--out", type=Path, default=common.RESULTS)
    args = parser.parse_args(argv)
    sentences = varied_sentences(args.data)
    machine = common.machine_info()
    work = common.WORK / STEM
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for name in args.servers.split(","):
        if name == "st":
            url, running = peer_server(args.model, work)
        else:
            variant = "fp32" if name == "ours-fp32" else "int8-rowwise"
            url, running = serve_variant(args.bundle, variant, work, MAX_QUEUE=str(args.max_queue))
        print(f"{name} at {url}", flush=True)
        with running as pid:
            rows += run_server(name, url, pid, sentences, args)
    report = {
        "command": common.repo_relative(" ".join(["python -m benchmarks.embed_bench", *sys.argv[1:]])),
        "bundle": common.repo_relative(str(args.bundle)),
        "duration_s": args.duration,
        "max_queue": args.max_queue,
        "machine": machine,
        "load_average_at_end": common.machine_info().get("load_average_at_start"),
        "rows": rows,
        "ratios": ratios(rows),
    }
    common.write_results(args.out, STEM, report, markdown(report), lambda path: plot(report, path))


def ratios(rows: list[dict]) -> list[dict]:
    """Each of our servers' texts/s over the peer's, level by level."""
    by = {(r["server"], r["concurrency"], r["texts_per_request"]): r for r in rows}
    out = []
    for concurrency, per_request in LEVELS:
        peer = by.get(("st", concurrency, per_request))
        for name in ("ours", "ours-fp32"):
            mine = by.get((name, concurrency, per_request))
            if peer and mine and peer["texts_per_s"]:
                out.append(
                    {
                        "server": name,
                        "concurrency": concurrency,
                        "texts_per_request": per_request,
                        "over_sentence_transformers": round(mine["texts_per_s"] / peer["texts_per_s"], 2),
                    }
                )
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# /embed throughput: our service against FastAPI + sentence-transformers",
        "",
        f"`{report['command']}`; closed loop, {report['duration_s']:.0f} s per level, one server at a time, "
        f"the same all-MiniLM-L6-v2 weights, the 200 varied sentences; ours with "
        f"MAX_QUEUE={report['max_queue']}. "
        "**The machine (2 cores) was shared "
        "with other engineers' jobs (one of them pretraining) during the run**: the load generator and the "
        f"servers ran beside them (load average {report['machine'].get('load_average_at_start')} at the "
        f"start, {report['load_average_at_end']} at the end); read the ratios, taken minutes apart.",
        "",
        "| server | concurrency | texts / request | requests/s | texts/s | p50 ms | p99 ms "
        "| CPU-s / 1k texts | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['server']} | {r['concurrency']} | {r['texts_per_request']} | {r['requests_per_s']:.1f} | "
            f"{r['texts_per_s']:.1f} | {r['p50_ms']} | {r['p99_ms']} | {r['cpu_seconds_per_1000_texts']} | "
            f"{sum(r['errors'].values())} |"
        )
    lines += [
        "",
        "| ours / sentence-transformers (texts/s) | c=1, 1 text | c=1, 32 texts | c=32, 1 text "
        "| c=32, 32 texts |",
    ]
    lines.append("|---|---:|---:|---:|---:|")
    for name in ("ours", "ours-fp32"):
        cells = {
            (r["concurrency"], r["texts_per_request"]): r for r in report["ratios"] if r["server"] == name
        }
        if cells:
            values = [
                f"{cells[level]['over_sentence_transformers']:.2f}×" if level in cells else "—"
                for level in LEVELS
            ]
            lines.append(f"| {name} | " + " | ".join(values) + " |")
    lines += ["", f"Machine: {common.machine_line(report['machine'])}"]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    servers = list(dict.fromkeys(r["server"] for r in report["rows"]))
    width = 0.8 / max(1, len(servers))
    for k, name in enumerate(servers):
        values = [
            next(
                (
                    r["texts_per_s"]
                    for r in report["rows"]
                    if r["server"] == name and (r["concurrency"], r["texts_per_request"]) == level
                ),
                0,
            )
            for level in LEVELS
        ]
        ax.bar([i + k * width for i in range(len(LEVELS))], values, width, label=name)
    ax.set_xticks([i + width * (len(servers) - 1) / 2 for i in range(len(LEVELS))])
    ax.set_xticklabels([f"c={c}, {n} text{'s' if n > 1 else ''}/req" for c, n in LEVELS])
    ax.set_ylabel("texts / s")
    ax.set_title("/embed throughput, all-MiniLM-L6-v2 (shared 2-core machine)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
