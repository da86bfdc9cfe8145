"""The engine boundary's cost: this tree's server against a baseline commit's (before the split), the
default configuration (every default bundle loaded), /classify and /embed at c=1 and c=32, in
alternating rounds in one run; plus each server's CPU per request.

    python -m benchmarks.engine_split --baseline layout-v1 --models-dir .cache/bundles
    python -m benchmarks.engine_split --quick ...         # 1 round of 3 s: a smoke run

Both servers run side by side (idle while the other is measured), started as `uvicorn app.main:app`
(with the connection layer where the tree has one, as `python -m app` runs it) from their own
source tree (the baseline's from `git archive`). Results: benchmarks/results/engine_split.*
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks import bench_common as common
from benchmarks.loadgen_payloads import make_payload
from benchmarks.rawhttp import ConnectionPool, post_json

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ENDPOINTS = ("classify", "embed")


def extract(ref: str, into: Path) -> Path:
    """The source packages of commit `ref`, as a tree a server can run from."""
    archive = into / "src.tar"
    packages = ["app", "processing", "export", "model", "train"]
    subprocess.run(["git", "archive", "-o", str(archive), ref, *packages], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def start(tree: Path, models_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = common.free_port()
    command = common.uvicorn_command(port, tree)
    env = {**os.environ, "MODELS_DIR": str(models_dir), "LOG_LEVEL": "WARNING", "DEVICE": "cpu"}
    env["PYTHONPATH"] = str(tree)
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server {url} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server {url} not ready after {timeout_s}s")


async def closed_loop(url: str, endpoint: str, clients: int, duration_s: float, seed: int) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    rng = random.Random(seed)
    bodies = [post_json(f"/{endpoint}", make_payload(endpoint, rng)) for _ in range(256)]
    pools = [ConnectionPool(host, int(port)) for _ in range(clients)]
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration_s

    async def client(index: int) -> None:
        nonlocal errors
        n = index
        while time.perf_counter() < stop:
            started = time.perf_counter()
            response = await pools[index].request(bodies[n % len(bodies)])
            n += clients
            if response.status != 200:
                errors += 1
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - started
    for pool in pools:
        await pool.close()
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
    }


def measure(url: str, pid: int, endpoint: str, clients: int, duration_s: float, seed: int) -> dict[str, Any]:
    asyncio.run(closed_loop(url, endpoint, clients, 1.0, seed))  # warm the connections and the path
    cpu = common.tree_cpu_seconds(pid)
    result = asyncio.run(closed_loop(url, endpoint, clients, duration_s, seed))
    result["server_cpu_ms_per_request"] = (
        (common.tree_cpu_seconds(pid) - cpu) * 1000 / max(1, result["requests"])
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="layout-v1", help="git ref of the single-process baseline")
    parser.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "bundles")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default="engine_split")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration = 1, 3.0
    levels = [int(c) for c in args.concurrency.split(",")]
    baseline = git(ROOT, "rev-parse", "--short", args.baseline)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": extract(args.baseline, Path(tmp)), "split": ROOT}
        servers = {
            name: start(tree, args.models_dir.resolve(), Path(tmp) / f"{name}.log")
            for name, tree in trees.items()
        }
        try:
            for proc, url in servers.values():
                wait_ready(proc, url)
            for round_ in range(args.rounds):
                for endpoint in ENDPOINTS:
                    for clients in levels:
                        order = list(servers) if round_ % 2 == 0 else list(servers)[::-1]  # alternate
                        for name in order:
                            proc, url = servers[name]
                            result = measure(url, proc.pid, endpoint, clients, args.duration, seed=round_)
                            rows.append(
                                {
                                    "server": name,
                                    "round": round_,
                                    "endpoint": endpoint,
                                    "clients": clients,
                                    **result,
                                }
                            )
                            print(rows[-1], flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    summary = []
    for endpoint in ENDPOINTS:
        for clients in levels:
            cell = {"endpoint": endpoint, "clients": clients}
            for name in ("baseline", "split"):
                mine = [
                    r for r in rows if (r["server"], r["endpoint"], r["clients"]) == (name, endpoint, clients)
                ]
                cell[f"{name}_rps"] = round(median(r["rps"] for r in mine), 1)
                cell[f"{name}_p50_ms"] = round(median(r["p50_ms"] for r in mine), 3)
                cell[f"{name}_cpu_ms"] = round(median(r["server_cpu_ms_per_request"] for r in mine), 3)
            cell["ratio_rps"] = round(cell["split_rps"] / cell["baseline_rps"], 3)
            summary.append(cell)
    report = {
        "command": common.command("engine_split", argv if argv is not None else sys.argv[1:]),
        "baseline": f"{args.baseline} ({baseline})",
        "machine": common.machine_info(),
        "rounds": args.rounds,
        "duration_s": args.duration,
        "summary": summary,
        "rows": rows,
    }
    lines = [
        f"# Engine boundary against the single process before it ({report['baseline']})",
        "",
        f"`{report['command']}`; {common.machine_line(report['machine'])}. Medians of {args.rounds} "
        f"alternating rounds of {args.duration:g} s; the default configuration (every default bundle), "
        "DEVICE=cpu.",
        "",
        "| endpoint | c | baseline req/s | split req/s | ratio | baseline p50 ms | split p50 ms "
        "| server CPU ms/req, baseline / split |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in summary:
        lines.append(
            f"| /{c['endpoint']} | {c['clients']} | {c['baseline_rps']} | {c['split_rps']} "
            f"| {c['ratio_rps']} | {c['baseline_p50_ms']} | {c['split_p50_ms']} "
            f"| {c['baseline_cpu_ms']} / {c['split_cpu_ms']} |"
        )

    def plot(path: Path) -> None:
        plt = common.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.5))
        at = range(len(summary))
        ax.bar([i - 0.2 for i in at], [1.0] * len(summary), 0.4, label=f"baseline {baseline}")
        ax.bar([i + 0.2 for i in at], [c["ratio_rps"] for c in summary], 0.4, label="engine boundary (N=1)")
        ax.axhline(0.95, color="gray", linestyle="--", linewidth=1)
        ax.set_xticks(list(at), [f"/{c['endpoint']} c={c['clients']}" for c in summary])
        ax.set_ylabel("req/s relative to baseline")
        ax.legend(loc="lower right")
        common.save_figure(fig, path)

    common.write_results(RESULTS, args.name, report, "\n".join(lines), plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
