"""Soak test: the real server at half its saturating rate for a long time, watching memory and errors.
Passes (exit 0) when no request failed or was dropped, RSS grew less than --max-growth-pct after the
warm-up, and the server shut down cleanly.

    .venv/bin/python -m benchmarks.soak --models-dir models                  # 30 minutes
    .venv/bin/python -m benchmarks.soak --tiny --duration 60 --name soak_quick  # 1-minute smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks import reliability as rel
from benchmarks.loadgen import LoadConfig, parse_mix, run_load


def rss_growth(samples: list[dict[str, float]], warmup_s: float) -> dict[str, float | None]:
    """RSS growth after the warm-up: the medians of a window at each end (a fifth of the steady samples,
    at most 20), since a QA batch briefly maps hundreds of MB and one sample on such a spike is not
    growth; the least-squares slope beside them."""
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


def sampler(pid: int, every_s: float, duration_s: float, samples: list[dict[str, float]]):
    """The soak's scenario: the server's RSS, CPU, threads and open files every `every_s` seconds."""
    import psutil

    process = psutil.Process(pid)
    process.cpu_percent()  # the first call only starts the measurement

    async def sample(run: rel.Run) -> None:
        while True:
            samples.append({"t_s": round(run.t(), 1), "rss_mb": round(process.memory_info().rss / 2**20, 2),
                            "cpu_percent": process.cpu_percent(), "threads": process.num_threads(),
                            "open_files": process.num_fds()})  # fmt: skip
            if run.t() >= duration_s:
                return
            await asyncio.sleep(min(every_s, max(0.0, duration_s - run.t())))

    return sample


def markdown(report: dict[str, Any]) -> str:
    load, rss, lat, probe = report["load"], report["rss"], report["load"]["latency_ms"], report["probe"]
    rate = f"- Soak rate {report['rate_rps']} req/s (given)"
    if report["saturation_rps"]:
        rate = (f"- Saturating rate (closed loop, {probe['concurrency']} clients, {probe['duration_s']} s): "
                f"{report['saturation_rps']} req/s; soak rate {report['rate_rps']} req/s "
                f"({report['fraction']:.0%} of it)")  # fmt: skip
    body = [
        f"- Models: {report['models_dir']}; server settings from the environment plus {report['server_env']}",
        rate + f" for {report['duration_s']} s, endpoints {report['endpoints']}",
        f"- Requests: {load['requests']}, ok {load['ok']}, errors {load['errors']} "
        f"{load['errors_by_status'] or ''}, dropped {load['dropped']}, schema errors {load['schema_errors']}",
        f"- Latency (ms): p50 {lat['p50']}, p95 {lat['p95']}, p99 {lat['p99']}, max {lat['max']}",
        f"- RSS (median of {rss['window_samples']} samples): {rss['baseline_mb']} MB after the "
        f"{report['warmup_s']} s warm-up -> {rss['final_mb']} MB at the end ({rss['growth_pct']:+}%, "
        f"limit {report['max_growth_pct']}%); first vs last single sample "
        f"{rss['single_sample_growth_pct']:+}%; peak {rss['peak_mb']} MB (transient), "
        f"trend {rss['slope_mb_per_hour']} MB/h (every sample, with CPU, threads and open files: the JSON)",
    ]  # fmt: skip
    return rel.markdown("Soak test", report, body)


def plot(report: dict[str, Any], path: Path) -> None:
    fig, ax = common.pyplot().subplots(figsize=(8, 4))
    ax.plot([s["t_s"] for s in report["samples"]], [s["rss_mb"] for s in report["samples"]])
    ax.axvline(report["warmup_s"], linestyle="--", color="grey", label="end of warm-up")
    ax.set(xlabel="time (s)", ylabel="server RSS (MB)", title=f"Soak at {report['rate_rps']} req/s")
    ax.legend()
    common.save_figure(fig, path)


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
    if any("=" not in item for item in args.server_env):
        p.error("--server-env takes KEY=VALUE")
    try:
        parse_mix(args.endpoints)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args, machine = parse_args(argv), common.machine_info()
    models_dir = common.build_tiny_models() if args.tiny else args.models_dir.resolve()
    server_env = dict(item.split("=", 1) for item in args.server_env)
    if args.tiny:  # 64-token windows turn one long loadgen QA context into hundreds of queued work items
        server_env.setdefault("MAX_QUEUE", "8192")
    api_key = server_env.get("API_KEY") or os.environ.get("API_KEY") or None  # the server's, if it has one
    log_path = common.ROOT / ".cache" / "soak" / f"{args.name}.server.log"
    outcome: dict[str, Any] = {}
    url, running = common.serve_ours(models_dir, log_path, outcome=outcome, **server_env)
    mix, saturation, rate, samples = parse_mix(args.endpoints), None, args.rate, []
    with running as pid:
        if not rate:
            print(f"probing saturation: {args.probe_concurrency} closed-loop clients, {args.probe_duration}s")
            probe = LoadConfig(url=url, duration_s=args.probe_duration, concurrency=args.probe_concurrency,
                               endpoints=mix, seed=1, api_key=api_key)  # fmt: skip
            saturation = asyncio.run(run_load(probe))["throughput_rps"]
            rate = round(args.fraction * saturation, 2)
        print(f"soaking at {rate} req/s for {args.duration}s, RSS every {args.sample_every}s", flush=True)
        config = LoadConfig(url, rate=rate, duration_s=args.duration, concurrency=256, endpoints=mix, seed=2,
                            api_key=api_key)  # fmt: skip
        scenario = sampler(pid, args.sample_every, args.duration, samples)
        load = asyncio.run(rel.under_load(rel.Run("soak"), lambda stop: run_load(config), scenario))
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    warmup = args.warmup if args.warmup is not None else round(0.1 * args.duration, 1)
    rss = rss_growth(samples, warmup)
    report = {
        "command": common.command("soak", argv),
        "date": common.now(),
        "machine": machine,
        "models_dir": str(models_dir),  # repo-relative in the results (write_results)
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
        "checks": {
            "zero_errors": load["errors"] == 0 and load["dropped"] == 0 and load["schema_errors"] == 0,
            "rss_growth_ok": rss["growth_pct"] < args.max_growth_pct,
            "clean_shutdown": outcome["exit_code"] in (0, -signal.SIGTERM) and "Traceback" not in log_text,
        },
        "server_exit_code": outcome["exit_code"],
        "server_log": str(log_path),
        "load": load,  # loadgen's report; its config masks the API key
        "samples": samples,
    }
    print(
        f"{load['requests']} requests, {load['errors']} errors, {load['dropped']} dropped; RSS "
        f"{rss['baseline_mb']} -> {rss['final_mb']} MB ({rss['growth_pct']:+}%)"
    )
    return rel.finish(args.out, args.name, report, markdown(report), lambda path: plot(report, path))


if __name__ == "__main__":
    sys.exit(main())
