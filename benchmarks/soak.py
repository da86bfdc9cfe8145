"""Soak test: the real server at half its saturating rate for a long time, watching memory and errors.

    .venv/bin/python -m benchmarks.soak --models-dir models                  # 30 minutes
    .venv/bin/python -m benchmarks.soak --tiny --duration 60 --name soak_quick  # 1-minute smoke run

Starts `uvicorn app.main:app` on loopback with MODELS_DIR (other settings from the environment or
--server-env), finds the saturating rate with a short closed-loop run of benchmarks/loadgen.py's
request mix, then sends that mix open loop at --fraction of it (default 50%) for --duration seconds,
sampling the server's RSS every --sample-every seconds. Passes (exit 0) when no request failed or
was dropped and RSS grew less than --max-growth-pct from the end of the warm-up to the end
(medians of a few minutes at each end, so a transient batch allocation is not counted as growth).
Writes benchmarks/results/<name>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks.loadgen import LoadConfig, parse_mix, run_load


def rss_growth(samples: list[dict[str, float]], warmup_s: float) -> dict[str, float | None]:
    """RSS growth after the warm-up, from the medians of the first and last few minutes.

    Single samples are noisy: a QA batch of many windows briefly maps hundreds of MB that
    are returned right after, so one sample landing on such a spike is not growth. The
    medians of a window at each end (a fifth of the steady samples, at most 20) are compared,
    and the least-squares slope is reported beside them.
    """
    steady = [s for s in samples if s["t_s"] >= warmup_s] or samples[-1:]
    window = max(1, min(20, len(steady) // 5))
    baseline = statistics.median(s["rss_mb"] for s in steady[:window])
    final = statistics.median(s["rss_mb"] for s in steady[-window:])
    first, last = steady[0]["rss_mb"], steady[-1]["rss_mb"]
    slope = None
    if len(steady) >= 3 and len({s["t_s"] for s in steady}) > 1:
        slope = common.linear_fit([s["t_s"] for s in steady], [s["rss_mb"] for s in steady])["slope"] * 3600
    return {
        "window_samples": window,
        "baseline_mb": round(baseline, 1),
        "final_mb": round(final, 1),
        "peak_mb": round(max(s["rss_mb"] for s in samples), 1),
        "growth_mb": round(final - baseline, 1),
        "growth_pct": round((final - baseline) / baseline * 100, 2),
        "single_sample_growth_pct": round((last - first) / first * 100, 2),
        "slope_mb_per_hour": round(slope, 1) if slope is not None else None,
    }


async def sample_rss(pid: int, every_s: float, samples: list[dict[str, float]], stop: asyncio.Event) -> None:
    import psutil

    process, started = psutil.Process(pid), time.monotonic()
    process.cpu_percent()  # the first call only starts the measurement
    while True:
        samples.append(
            {
                "t_s": round(time.monotonic() - started, 1),
                "rss_mb": round(process.memory_info().rss / 2**20, 2),
                "cpu_percent": process.cpu_percent(),
                "threads": process.num_threads(),
                "open_files": process.num_fds(),
            }
        )
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except asyncio.TimeoutError:
            pass


async def soak(config: LoadConfig, pid: int, every_s: float) -> tuple[dict[str, Any], list[dict[str, float]]]:
    samples: list[dict[str, float]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(pid, every_s, samples, stop))
    try:
        report = await run_load(config)
    finally:
        stop.set()
        await sampler
    return report, samples


def markdown(report: dict[str, Any]) -> str:
    load, rss, lat = report["load"], report["rss"], report["load"]["latency_ms"]
    verdict = "PASS" if report["passed"] else "FAIL"
    lines = [
        f"# Soak test: {verdict}",
        "",
        f"Generated {report['generated']} by `{report['command']}`.",
        "",
        f"- Models: {report['models_dir']}; server settings from the environment plus {report['server_env']}",
        (
            f"- Saturating rate (closed loop, {report['probe']['concurrency']} clients, "
            f"{report['probe']['duration_s']} s): {report['saturation_rps']} req/s; soak rate "
            f"{report['rate_rps']} req/s ({report['fraction']:.0%} of it)"
            if report["saturation_rps"]
            else f"- Soak rate {report['rate_rps']} req/s (given)"
        )
        + f" for {report['duration_s']} s, endpoints {report['endpoints']}",
        f"- Requests: {load['requests']}, ok {load['ok']}, errors {load['errors']} "
        f"{load['errors_by_status'] or ''}, dropped {load['dropped']}, schema errors {load['schema_errors']}",
        f"- Latency (ms): p50 {lat['p50']}, p95 {lat['p95']}, p99 {lat['p99']}, max {lat['max']}",
        f"- RSS (median of {rss.get('window_samples', 1)} samples): {rss['baseline_mb']} MB after the "
        f"{report['warmup_s']} s warm-up -> {rss['final_mb']} MB at the end ({rss['growth_pct']:+}%, "
        f"limit {report['max_growth_pct']}%); first vs last single sample "
        f"{rss.get('single_sample_growth_pct', rss['growth_pct']):+}%; peak {rss['peak_mb']} MB (transient), "
        f"trend {rss['slope_mb_per_hour']} MB/h",
        f"- Zero errors: {report['checks']['zero_errors']}; RSS growth within limit: "
        f"{report['checks']['rss_growth_ok']}; clean shutdown: {report['checks']['clean_shutdown']}",
        "",
        "| t (s) | RSS (MB) | CPU % | threads | open files |",
        "|---:|---:|---:|---:|---:|",
    ]
    step = max(1, len(report["samples"]) // 30)  # at most ~30 rows; the JSON has them all
    for s in report["samples"][::step]:
        lines.append(
            f"| {s['t_s']} | {s['rss_mb']} | {s['cpu_percent']} | {s['threads']} | {s['open_files']} |"
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    verdict = "PASS" if report["passed"] else "FAIL"
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s["t_s"] for s in report["samples"]], [s["rss_mb"] for s in report["samples"]])
    ax.axvline(report["warmup_s"], linestyle="--", color="grey", label="end of warm-up")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("server RSS (MB)")
    ax.set_title(f"Soak at {report['rate_rps']} req/s: {verdict}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models-dir", type=Path, help="MODELS_DIR for the server")
    p.add_argument("--tiny", action="store_true", help="serve four tiny random bundles (built once)")
    p.add_argument("--duration", type=float, default=1800.0, help="seconds at the soak rate (default 30 min)")
    p.add_argument("--fraction", type=float, default=0.5, help="share of the saturating rate (default 0.5)")
    p.add_argument("--rate", type=float, help="requests/s; skips the saturation probe")
    p.add_argument("--probe-duration", type=float, default=15.0, help="seconds of the saturation probe")
    p.add_argument("--probe-concurrency", type=int, default=16)
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS samples")
    p.add_argument("--warmup", type=float, help="seconds before the RSS baseline (default 10%% of duration)")
    p.add_argument("--max-growth-pct", type=float, default=5.0, help="RSS growth allowed after warm-up")
    p.add_argument("--endpoints", default="all", help="loadgen mix: 'all', 'classify,qa', 'classify=3,ner=1'")
    p.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE", help="server setting")
    p.add_argument("--name", default="soak", help="results file name (default soak)")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    args = p.parse_args(argv)
    if (args.models_dir is None) == (not args.tiny):
        p.error("give --models-dir DIR or --tiny")
    if args.models_dir is not None and not args.models_dir.is_dir():
        p.error(f"--models-dir {args.models_dir} is not a directory")
    if not 0 < args.fraction <= 1 or args.duration <= 0 or args.sample_every <= 0:
        p.error("--fraction must be in (0, 1], --duration and --sample-every > 0")
    for item in args.server_env:
        if "=" not in item:
            p.error(f"--server-env {item!r} must look like KEY=VALUE")
    try:
        parse_mix(args.endpoints)
    except ValueError as e:
        p.error(str(e))
    return args


def shown(path: Path) -> str:
    """A path as results record it: relative to the repository where it lies inside (no machine paths)."""
    try:
        return str(path.resolve().relative_to(common.ROOT))
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models_dir = common.build_tiny_models() if args.tiny else args.models_dir.resolve()
    server_env = dict(item.split("=", 1) for item in args.server_env)
    if args.tiny:
        # 64-token windows turn one long loadgen QA context into hundreds of queued work items.
        server_env.setdefault("MAX_QUEUE", "8192")
    api_key = server_env.get("API_KEY") or os.environ.get("API_KEY") or None  # the server's, if it has one
    log_path = common.ROOT / ".cache" / "soak" / f"{args.name}.server.log"
    outcome: dict[str, Any] = {}
    url, running = common.serve_ours(models_dir, log_path, outcome=outcome, **server_env)
    mix = parse_mix(args.endpoints)
    with running as pid:
        if args.rate:
            saturation = None
            rate = args.rate
        else:
            probe = LoadConfig(
                url=url, rate=None, duration_s=args.probe_duration, concurrency=args.probe_concurrency,
                endpoints=mix, seed=1, api_key=api_key,
            )  # fmt: skip
            print(
                f"probing saturation: closed loop, {args.probe_concurrency} clients, {args.probe_duration}s"
            )
            saturation = asyncio.run(run_load(probe))["throughput_rps"]
            rate = round(args.fraction * saturation, 2)
        print(f"soaking at {rate} req/s for {args.duration}s, RSS every {args.sample_every}s", flush=True)
        config = LoadConfig(
            url=url, rate=rate, duration_s=args.duration, concurrency=256, endpoints=mix, seed=2,
            api_key=api_key,
        )  # fmt: skip
        load, samples = asyncio.run(soak(config, pid, args.sample_every))
    exit_code = outcome["exit_code"]
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    warmup = args.warmup if args.warmup is not None else round(0.1 * args.duration, 1)
    rss = rss_growth(samples, warmup)
    checks = {
        "zero_errors": load["errors"] == 0 and load["dropped"] == 0 and load["schema_errors"] == 0,
        "rss_growth_ok": rss["growth_pct"] < args.max_growth_pct,
        "clean_shutdown": exit_code in (0, -signal.SIGTERM) and "Traceback" not in log_text,
    }
    report = {
        "generated": common.now(),
        "command": "python -m benchmarks.soak " + " ".join(sys.argv[1:] if argv is None else argv),
        "models_dir": shown(models_dir),
        "server_env": {k: "***" if k == "API_KEY" else v for k, v in server_env.items()},
        "probe": {"concurrency": args.probe_concurrency, "duration_s": args.probe_duration},
        "saturation_rps": saturation,
        "fraction": args.fraction if saturation else None,
        "rate_rps": rate,
        "duration_s": args.duration,
        "endpoints": args.endpoints,
        "warmup_s": warmup,
        "max_growth_pct": args.max_growth_pct,
        "rss": rss,
        "checks": checks,
        "passed": all(checks.values()),
        "server_exit_code": exit_code,
        "server_log": shown(log_path),
        "load": load,  # loadgen's report; its config masks the API key
        "samples": samples,
    }
    common.write_results(args.out, args.name, report, markdown(report), lambda path: plot(report, path))
    print(
        f"{'PASS' if report['passed'] else 'FAIL'}: {load['requests']} requests, {load['errors']} errors, "
        f"{load['dropped']} dropped; RSS {rss['baseline_mb']} -> {rss['final_mb']} MB "
        f"({rss['growth_pct']:+}%); p99 {load['latency_ms']['p99']} ms; results: {args.out / args.name}.json"
    )
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
