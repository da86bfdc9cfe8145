"""Which batching and session settings serve most: our real server under the same load per setting.

    .venv/bin/python -m benchmarks.batching_sweep                 # defaults: /classify, c=1 and 32
    .venv/bin/python -m benchmarks.batching_sweep --duration 5 --settings "pf1.1=MAX_PADDING_FACTOR=1.1"

Each setting starts `uvicorn app.main:app` on the SST-2 bundle alone with a few environment
overrides, warms up, then runs the closed-loop load generator at each concurrency. Besides
throughput and latency it reads the batcher's own histograms from /metrics: the mean batch size
and the padded tokens per request, which explain the throughput. The defaults in app/backend/runtime.py
(CPU_PADDING_FACTOR, resolve_instances) were chosen from this table.
Writes benchmarks/results/batching_sweep.{json,md,png} (batching_sweep_<endpoint>.* for others).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks import service_bench

DEFAULT_SETTINGS = {
    "default": "",
    "padding-1.05": "MAX_PADDING_FACTOR=1.05",
    "padding-1.2": "MAX_PADDING_FACTOR=1.2",
    "padding-1.5": "MAX_PADDING_FACTOR=1.5",
    "padding-2": "MAX_PADDING_FACTOR=2",
    "padding-off": "MAX_PADDING_FACTOR=0",
    "1-instance-all-threads": "MODEL_INSTANCES=1",
    "2-instances-2-threads": "MODEL_INSTANCES=2 INTRA_OP_THREADS=2",
    "wait-2ms": "MAX_WAIT_MS=2",
    "tokens-8192": "MAX_BATCH_TOKENS=8192",
    "no-inline": "INLINE_BATCH_TOKENS=0",
    "shrink-every-run": "ORT_SHRINK_ABOVE_TOKENS=0",
}


def parse_settings(spec: str | None) -> dict[str, dict[str, str]]:
    """'name=ENV=V ENV2=V2;name2=...' (or the defaults) -> {name: {ENV: V}}."""
    pairs = DEFAULT_SETTINGS if spec is None else dict(p.split("=", 1) for p in spec.split(";") if p.strip())
    out: dict[str, dict[str, str]] = {}
    for name, env in pairs.items():
        out[name.strip()] = dict(kv.split("=", 1) for kv in env.split())
    return out


def one_setting(name: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    models_dir = args.work_dir / f"models-dir-{args.endpoint}"
    models_dir.mkdir(parents=True, exist_ok=True)
    link = models_dir / args.bundle.name
    if not link.exists():
        link.symlink_to(args.bundle.resolve(), target_is_directory=True)
    # The service's own log level (its access log is part of the cost measured), unless set.
    settings = {"DEVICE": "cpu", "LOG_LEVEL": os.environ.get("LOG_LEVEL", "INFO"), **env}
    url, running = common.serve_ours(models_dir, args.work_dir / "logs" / f"{name}.log", **settings)
    print(f"  {name}", flush=True)
    with running as pid:
        model = httpx.get(f"{url}/models", timeout=10).json()["models"][0]
        workloads = [(args.endpoint, level) for level in args.concurrency]
        levels = service_bench.load_levels(url, pid, workloads, "ours", args)
    keys = ("instances", "intra_op_threads", "limits")
    return {"env": env, **{key: model.get(key) for key in keys}, "levels": levels}


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        "# Batching and session settings under the same load",
        "",
        f"Generated {report['created_at']} by `{s['command']}`.",
        "",
        f"- Machine: {common.machine_line(report['machine'])}",
        f"- Bundle `{s['bundle']}`, endpoint /{s['endpoint']}, closed loop {s['duration_s']} s per level "
        f"after {s['warmup_s']} s warm-up; the load generator (benchmarks/loadgen.py) shares the cores.",
        "",
        "| setting | env | sessions x threads | concurrency | req/s | p50 ms | p99 ms | mean batch | "
        "padded tokens / req | CPU-s / 1k req |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["results"].items():
        env = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "(service defaults)"
        for level in r["levels"]:
            lat, get = level["latency_ms"], level.get
            lines.append(
                f"| {name} | `{env}` | {r['instances']} x {r['intra_op_threads']} | {level['concurrency']} | "
                f"{level['throughput_rps']:.1f} | {lat['p50']} | {lat['p99']} | {get('mean_batch_size')} | "
                f"{get('padded_tokens_per_request')} | {level['cpu_seconds_per_1000_requests']} |"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    top = max(report["settings"]["concurrency"])
    names = list(report["results"])
    rps = [
        next(lv["throughput_rps"] for lv in report["results"][n]["levels"] if lv["concurrency"] == top)
        for n in names
    ]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
    ax.barh(names, rps, color="C0")
    ax.invert_yaxis()
    ax.set_xlabel(f"requests/s at concurrency {top}")
    ax.set_title(f"/{report['settings']['endpoint']}: throughput by setting")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, help="default: the endpoint's default bundle")
    p.add_argument("--endpoint", default="classify", choices=("classify", "qa", "ner", "multiple-choice"))
    p.add_argument("--settings", help="'name=ENV=V ENV2=V;name2=ENV=V' (default: the built-in sweep)")
    p.add_argument("--concurrency", default="1,32", help="comma list")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--work-dir", type=Path, default=common.WORK / "batching_sweep")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.bundle = args.bundle or common.default_bundle(args.endpoint)
    common.require_bundle(args.bundle, args.endpoint)
    settings = parse_settings(args.settings)
    report: dict[str, Any] = {
        "created_at": common.now(),
        "machine": common.machine_info(),
        "settings": {
            "command": "python -m benchmarks.batching_sweep "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "bundle": str(args.bundle),
            "endpoint": args.endpoint,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
        },
        "results": {},
    }
    started = time.perf_counter()
    for name, env in settings.items():
        report["results"][name] = one_setting(name, env, args)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    stem = (
        "batching_sweep"
        if args.endpoint == "classify"
        else f"batching_sweep_{args.endpoint.replace('-', '_')}"
    )
    common.write_results(args.out, stem, report, markdown(report), lambda path: plot(report, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
