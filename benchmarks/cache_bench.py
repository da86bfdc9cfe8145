"""RESPONSE_CACHE_MB on a repetitive workload: Zipf-distributed sentences (s=1.1 over 1,000) to /embed
and /classify, against two servers on the default bundles, one without the cache and one with it,
in alternating rounds (the same request sequence each): throughput, p50/p99, server CPU per request
and the cache's hit rate. Writes benchmarks/results/cache.{json,md,png}.

    python -m benchmarks.cache_bench [--rounds 3] [--round-s 12] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from benchmarks import bench_common as common
from benchmarks import rawhttp
from benchmarks.loadgen import percentiles
from benchmarks.loadgen_payloads import CITIES, JOBS, ORGS, PEOPLE, _fact_sentence

SERVERS = {"off": "0", "on": "64"}  # RESPONSE_CACHE_MB


def sentences(n: int) -> list[str]:
    combos = itertools.product(PEOPLE, CITIES, ORGS, range(1950, 2000), JOBS)
    return [_fact_sentence(p, c, o, y, j) for p, c, o, y, j in itertools.islice(combos, 0, n * 7, 7)]


def zipf_requests(texts: list[str], s: float, count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    ranks = rng.choices(range(len(texts)), weights=[1 / (k + 1) ** s for k in range(len(texts))], k=count)
    return [
        rawhttp.encode_request("POST", "/embed", json.dumps({"inputs": texts[i]}).encode(), {}, "bench")
        if n % 2
        else rawhttp.encode_request("POST", "/classify", json.dumps({"text": texts[i]}).encode(), {}, "bench")
        for n, i in enumerate(ranks)
    ]


async def closed_loop(
    url: str, requests: list[bytes], workers: int, seconds: float
) -> tuple[list[float], int]:
    pool, latencies, errors = rawhttp.ConnectionPool(*rawhttp.host_port(url)), [], 0
    queue, deadline = iter(requests), time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        for raw in queue:
            if time.perf_counter() > deadline:
                return
            started = time.perf_counter()
            response = await pool.request(raw)
            latencies.append(time.perf_counter() - started)
            errors += response.status != 200

    await asyncio.gather(*(worker() for _ in range(workers)))
    await pool.close()
    return latencies, errors


def one_round(url: str, pid: int, requests: list[bytes], workers: int, seconds: float) -> dict:
    cpu, (hits, misses), started = common.tree_cpu_seconds(pid), cache_counts(url), time.perf_counter()
    latencies, errors = asyncio.run(closed_loop(url, requests, workers, seconds))
    elapsed, (hits2, misses2) = time.perf_counter() - started, cache_counts(url)
    looked_up = hits2 - hits + misses2 - misses
    return {
        "requests": len(latencies),
        "errors": errors,
        "throughput_rps": len(latencies) / elapsed,
        "latency_ms": percentiles(latencies),
        "server_cpu_ms_per_request": 1000 * (common.tree_cpu_seconds(pid) - cpu) / len(latencies),
        "hit_rate": (hits2 - hits) / looked_up if looked_up else None,
        "load_average": os.getloadavg()[0],
    }


def cache_counts(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics").text
    count = lambda name: sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))  # noqa: E731
    return count("bert_cache_hits_total"), count("bert_cache_misses_total")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=common.ROOT / ".cache" / "bundles")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-s", type=float, default=12.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--zipf-s", type=float, default=1.1)
    parser.add_argument("--distinct", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=common.ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    texts, machine = sentences(args.distinct), common.machine_info()
    rounds: dict[str, list[dict]] = {name: [] for name in SERVERS}
    with ExitStack() as stack:
        urls = {}
        for name, mb in SERVERS.items():
            url, ctx = common.serve_ours(
                args.models_dir, common.WORK / f"cache-{name}.log", RESPONSE_CACHE_MB=mb
            )
            urls[name] = (url, stack.enter_context(ctx))
        for r in range(args.rounds):
            requests = zipf_requests(texts, args.zipf_s, 200_000, seed=r)
            for name, (url, pid) in urls.items():
                rounds[name].append(one_round(url, pid, requests, args.concurrency, args.round_s))
                print(name, r, {k: v for k, v in rounds[name][-1].items() if k != "latency_ms"}, flush=True)
    command = " ".join(["python", "-m", "benchmarks.cache_bench", *(sys.argv[1:] if argv is None else argv)])
    config = vars(args) | {"models_dir": str(args.models_dir), "out": str(args.out)}
    report = {
        "command": command,
        "date": common.now(),
        "machine": machine,
        "config": config,
        "rounds": rounds,
    }
    ratio = [
        on["throughput_rps"] / off["throughput_rps"]
        for on, off in zip(rounds["on"], rounds["off"], strict=True)
    ]
    lines = [
        f"# Response cache (RESPONSE_CACHE_MB) on a Zipf workload\n\n`{command}`  \n"
        f"{report['date']}; {common.machine_line(machine)}\n\nZipf s={args.zipf_s} over {args.distinct} "
        f"distinct sentences, half /embed and half /classify, {args.concurrency} closed-loop clients, "
        f"{args.round_s:.0f} s rounds, the two servers alternating (the same request sequence in a round). "
        "The machine is shared: compare the rows of one round.\n",
        "| round | cache | requests/s | p50 ms | p99 ms | server CPU ms/request | hit rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, name in itertools.product(range(args.rounds), SERVERS):
        x = rounds[name][r]
        hit = "" if x["hit_rate"] is None else f"{x['hit_rate']:.1%}"
        lines.append(
            f"| {r} | {name} | {x['throughput_rps']:.0f} | {x['latency_ms']['p50']:.2f} | "
            f"{x['latency_ms']['p99']:.2f} | {x['server_cpu_ms_per_request']:.2f} | {hit} |"
        )
    lines.append(
        f"\nThroughput with the cache / without, per round: {', '.join(f'{x:.2f}x' for x in ratio)}."
    )

    def plot(path: Path) -> None:
        plt = common.pyplot()
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name in SERVERS:
            ax.plot(
                range(args.rounds), [x["throughput_rps"] for x in rounds[name]], "o-", label=f"cache {name}"
            )
        ax.set_xlabel("round"), ax.set_ylabel("requests/s"), ax.legend(), ax.grid(alpha=0.3)
        ax.set_title(f"Zipf s={args.zipf_s} over {args.distinct}: /embed + /classify")
        fig.tight_layout(), fig.savefig(path, dpi=110), plt.close(fig)

    common.write_results(args.out, "cache", report, "\n".join(lines), plot)


if __name__ == "__main__":
    main()
