"""Our service vs the plain FastAPI servers a user would write instead, and vs its bare model.

    .venv/bin/python -m benchmarks.service_bench            # full: c=1,8,32,64, 20 s per level
    .venv/bin/python -m benchmarks.service_bench --quick    # smoke run (~2 min)
    .venv/bin/python -m benchmarks.service_bench --quick --dev-models   # before the defaults exist

For each endpoint (/classify, /qa; /embed for our servers only), one server at a time on loopback,
alternating over --rounds: our real server (`uvicorn app.main:app`, MODELS_DIR holding only that
endpoint's bundle), the same without its solo session (`ours-no-solo`), the same with every bundle
beside it loaded (`ours-defaults`, what `make serve` runs), any `--ablation`, the fair peer
(benchmarks/ort_server.py: the transformers tokenizer and one session.run per request on the same
file, no batching) and the pipeline baseline (benchmarks/pipeline_server.py) on the checkpoint the
bundle came from. Closed-loop load from benchmarks/loadgen.py (in this process, sharing the CPU
with every server alike) at each level, the same seeded payloads; we record throughput, p50/p99,
CPU-seconds per 1,000 requests of the server's process tree and CPU ms per request of its main
thread (our event loop), its other threads (our inference) and the load generator. Then, with no
server running, the model-only references on the same payloads: ORT time per request alone and
ORT throughput on full length-sorted batches. The targets are service_report.TARGETS.
Writes benchmarks/results/service{,_quick}.{json,md,png}.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from app.settings import available_cores
from benchmarks import bench_common as common
from benchmarks import loadgen, service_report
from benchmarks.loadgen_payloads import make_payload
from export.bundle import MANIFEST_NAME

ENDPOINTS = ("classify", "qa", "embed")  # embed: our servers only (no plain ORT or pipeline peer)
# ours-no-solo: our server without its solo session (SOLO_SESSION=false), the ablation of a lone
# request on every core against one core. ours-defaults: every bundle beside the endpoint's loaded
# (what `make serve` runs), the load on the endpoint's model alone.
SERVERS = ("ours", "ours-no-solo", "ours-defaults", "ort", "pipeline")
OUR_SERVERS = ("ours", "ours-no-solo", "ours-defaults")


def our_server(
    bundle: Path, port: int, args: argparse.Namespace, models_dir: Path, beside: bool = False
) -> tuple[list[str], dict]:
    """Our server on exactly this bundle, or (`beside`) on it and every bundle in its directory."""
    shutil.rmtree(models_dir, ignore_errors=True)  # only links live here
    models_dir.mkdir(parents=True)
    served = [bundle]
    if beside:
        served = sorted(p for p in bundle.parent.iterdir() if (p / MANIFEST_NAME).is_file())
    for path in served:
        (models_dir / path.name).symlink_to(path.resolve(), target_is_directory=True)
    command = [sys.executable, *f"-m uvicorn app.main:app --host 127.0.0.1 --port {port}".split()]
    command.append("--no-server-header")
    env = {
        "MODELS_DIR": str(models_dir),
        "CPU_VARIANT": args.cpu_variant,
        "DEVICE": "cpu",
        "INTRA_OP_THREADS": str(args.threads),
        "MODEL_INSTANCES": str(args.instances),
        **args.server_env,
    }
    return command, env


def pipeline_server(task: str, checkpoint: Path, bundle: Path, port: int, args) -> tuple[list[str], dict]:
    from benchmarks.pipeline_server import qa_settings_from_bundle
    from export.bundle import load_bundle_manifest

    command = [sys.executable, "-m", "benchmarks.pipeline_server", f"--{task}", str(checkpoint)]
    command += ["--port", str(port), "--threads", str(args.threads)]
    if task == "classify":
        command += ["--classify-max-length", str(load_bundle_manifest(bundle).max_seq_len)]
    if task == "qa":
        qa = qa_settings_from_bundle(bundle)
        command += ["--qa-max-seq-len", str(qa.max_seq_len), "--qa-doc-stride", str(qa.doc_stride)]
        command += ["--qa-max-question-len", str(qa.max_question_len)]
        command += ["--qa-max-answer-len", str(qa.max_answer_len)]
    return command, {}


def ort_server(task: str, bundle: Path, port: int, args) -> tuple[list[str], dict]:
    command = [sys.executable, "-m", "benchmarks.ort_server", f"--{task}", str(bundle), "--port", str(port)]
    return command + ["--variant", args.cpu_variant, "--threads", str(args.threads)], {}


def per_request_ms(seconds: float, requests: int) -> float | None:
    return round(1000 * seconds / requests, 3) if requests else None


def load_levels(url: str, pid: int, endpoint: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Warm up, then one closed-loop run per concurrency level with CPU accounting."""
    base = loadgen.LoadConfig(
        url=url,
        duration_s=args.warmup,
        concurrency=max(args.concurrency),
        endpoints={endpoint: 1.0},
        timeout_s=args.timeout,
        seed=args.seed,
    )
    loadgen.run(base)
    rows = []
    for level in args.concurrency:
        config = loadgen.LoadConfig(**{**base.__dict__, "duration_s": args.duration, "concurrency": level})
        cpu_before, main_before = common.tree_cpu_seconds(pid), common.main_thread_cpu_seconds(pid)
        client_before = sum(os.times()[:2])  # this process alone: the load generator
        report = loadgen.run(config)
        cpu = common.tree_cpu_seconds(pid) - cpu_before
        main = common.main_thread_cpu_seconds(pid) - main_before
        client = sum(os.times()[:2]) - client_before
        ok = report["ok"]

        rows.append(
            {
                "concurrency": level,
                "requests": report["requests"],
                "ok": ok,
                "errors": report["errors"],
                "errors_by_status": report["errors_by_status"],
                "schema_errors": report["schema_errors"],
                "throughput_rps": report["throughput_rps"],
                "latency_ms": report["latency_ms"],
                "cpu_seconds": round(cpu, 3),
                "cpu_seconds_per_1000_requests": round(1000 * cpu / ok, 3) if ok else None,
                # Where the server's CPU goes: its main thread (for us the event loop: HTTP,
                # validation, tokenizing, batching) and its other threads (for us inference).
                "cpu_ms_per_request": {
                    "main_thread": per_request_ms(main, ok),
                    "other_threads": per_request_ms(cpu - main, ok),
                    "load_generator": per_request_ms(client, ok),
                },
                "elapsed_s": report["elapsed_s"],
            }
        )
        lat = report["latency_ms"]
        print(
            f"    c={level:<3} {report['throughput_rps']:8.2f} req/s  p50 {lat['p50']} ms  "
            f"p99 {lat['p99']} ms  errors {report['errors']}  "
            f"cpu/1k {rows[-1]['cpu_seconds_per_1000_requests']} s",
            flush=True,
        )
    return rows


def model_only(
    bundle: Path, endpoint: str, args: argparse.Namespace, served: dict[str, int]
) -> dict[str, Any]:
    """ORT alone on the same payloads. One request: the server's session (its threads).
    Batched: the best the model does on this machine, over batch sizes and two layouts: one
    session with every core, and one single-threaded session per core side by side."""
    from benchmarks.model_only import (
        BundleModel,
        batched_reference,
        single_request_reference,
        tokenize_reference,
    )

    rng = random.Random(args.seed)  # the same payload pool the load generator draws from
    payloads = [make_payload(endpoint, rng) for _ in range(loadgen.POOL_SIZE)]
    cores = available_cores()
    single = BundleModel(bundle, args.cpu_variant, served["threads"])
    layouts = {(served["instances"], served["threads"]), (1, cores), (cores, 1)}
    batched = {}
    for instances, threads in sorted(layouts):
        model = BundleModel(bundle, args.cpu_variant, threads, instances)
        batched[f"{instances}x{threads}"] = batched_reference(model, payloads, args.model_seconds)
    best = max(batched, key=lambda name: batched[name]["best_requests_per_s"])
    return {
        "variant": args.cpu_variant,
        "cores": cores,  # the batched references use them all: the ceilings' CPU budget
        "threads": served["threads"],
        "instances": served["instances"],
        "single_request": single_request_reference(single, payloads, args.model_seconds),
        "tokenize": tokenize_reference(single, payloads, min(args.model_seconds, 2.0)),
        "batched": batched[best],
        "batched_layout": best,
        "batched_by_layout": batched,
    }


def served_layout(info: dict[str, Any]) -> dict[str, int]:
    """Sessions and threads per session of the one model our server runs (from GET /models)."""
    (model,) = [m for m in info["models"] if m["status"] == "ready"]
    return {"instances": model.get("instances") or 1, "threads": model["intra_op_threads"]}


def run_server(kind: str, endpoint: str, bundle: Path, checkpoint: Path, args) -> dict[str, Any]:
    """Start one server, load it at every concurrency level, stop it."""
    port = common.free_port()
    url = f"http://127.0.0.1:{port}"
    if kind in OUR_SERVERS or kind in args.ablations:
        models_dir = args.work_dir / "models-dir" / endpoint
        command, env = our_server(bundle, port, args, models_dir, beside=kind == "ours-defaults")
        if kind == "ours-no-solo":
            env["SOLO_SESSION"] = "false"
        env.update(args.ablations.get(kind, {}))
    elif kind == "ort":
        command, env = ort_server(endpoint, bundle, port, args)
    else:
        command, env = pipeline_server(endpoint, checkpoint, bundle, port, args)
    print(f"  {kind} server: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    log_path = args.work_dir / "logs" / f"{endpoint}-{kind}.log"
    with common.server(command, env, log_path, url, args.ready_timeout) as pid:
        ready_s = round(time.perf_counter() - started, 1)
        import httpx

        info = httpx.get(f"{url}/models", timeout=10).json()
        levels = load_levels(url, pid, endpoint, args)
        rss = common.tree_rss_mb(pid)
    return {
        "command": command,
        "env": env,
        "ready_seconds": ready_s,
        "models": info,
        "rss_mb_after_load": rss,
        "levels": levels,
    }


def run_endpoint(endpoint: str, bundle: Path, checkpoint: Path, how: str, args) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "bundle": str(bundle),
        "checkpoint": str(checkpoint),
        "checkpoint_source": how,
        "servers": {},
    }
    # Rounds alternate the servers, so a slow spell of a shared machine falls on all of them.
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in args.servers}
    for round_index in range(args.rounds):
        for kind in args.servers:
            if args.rounds > 1:
                print(f"  round {round_index + 1}/{args.rounds}", end="", flush=True)
            runs[kind].append(run_server(kind, endpoint, bundle, checkpoint, args))
    entry["servers"] = {kind: service_report.median_round(results) for kind, results in runs.items()}
    print("  model-only ORT reference", flush=True)
    served = served_layout(entry["servers"]["ours"]["models"]) if "ours" in entry["servers"] else None
    entry["model_only"] = model_only(
        bundle, endpoint, args, served or {"instances": 1, "threads": available_cores()}
    )
    entry["targets"] = service_report.targets(entry) if "ours" in entry["servers"] else {}
    return entry


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: c=1,8, 2 s per level")
    p.add_argument("--endpoints", default="classify,qa", help="comma list of " + ",".join(ENDPOINTS))
    p.add_argument("--servers", default=",".join(SERVERS), help="comma list of " + ",".join(SERVERS))
    p.add_argument("--concurrency", help="comma list (default 1,8,32,64; quick 1,8)")
    p.add_argument("--duration", type=float, help="seconds per level (default 20; quick 2)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per server (default 5; quick 1)")
    p.add_argument("--model-seconds", type=float, help="seconds per model-only reference (default 10)")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, s")
    p.add_argument("--ready-timeout", type=float, default=300.0, help="wait this long for a server's /ready")
    p.add_argument(
        "--cpu-variant",
        default="int8-rowwise",
        choices=("int8-rowwise", "int8", "fused", "fp32"),
        help="the variant our server and the plain ORT server run",
    )
    p.add_argument("--threads", type=int, default=0, help="ORT and torch threads (0 = all cores)")
    p.add_argument("--instances", type=int, default=0, help="our server's MODEL_INSTANCES (0 = automatic)")
    p.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE", help="our servers' setting"
    )
    p.add_argument(
        "--ablation",
        action="append",
        default=[],
        metavar="NAME:SETTING=VALUE[,SETTING=VALUE]",
        help="one more server, ours-NAME: ours with these settings, e.g. quiet:LOG_LEVEL=WARNING",
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="alternating rounds; each level's median is reported"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--classify-bundle", type=Path, default=common.default_bundle("classify"))
    p.add_argument("--qa-bundle", type=Path, default=common.default_bundle("qa"))
    p.add_argument(
        "--classify-checkpoint",
        default="auto",
        help="baseline checkpoint; auto = the bundle's source (see bench_common.resolve_checkpoint)",
    )
    p.add_argument("--qa-checkpoint", default="auto")
    p.add_argument("--embed-bundle", type=Path, default=common.ROOT / ".cache/bundles/all-minilm-l6-v2")
    p.add_argument("--dev-models", action="store_true", help="MiniLM with random heads, not the defaults")
    p.add_argument("--work-dir", type=Path, default=common.WORK)
    p.add_argument("--out", type=Path, default=common.RESULTS)
    p.add_argument("--name", help="results file stem (default service, or service_quick)")
    args = p.parse_args(argv)
    args.endpoints = [e for e in args.endpoints.split(",") if e]
    args.servers = [s for s in args.servers.split(",") if s]
    if set(args.endpoints) - set(ENDPOINTS) or not args.endpoints:
        p.error(f"--endpoints must name some of {ENDPOINTS}")
    try:
        args.ablations = {
            f"ours-{name}": dict(item.split("=", 1) for item in settings.split(","))
            for name, _, settings in (a.partition(":") for a in args.ablation)
        }
    except ValueError:
        p.error("--ablation takes NAME:SETTING=VALUE[,SETTING=VALUE]")
    args.servers += [kind for kind in args.ablations if kind not in args.servers]
    if set(args.servers) - set(SERVERS) - set(args.ablations) or not args.servers:
        p.error(f"--servers must name some of {SERVERS}")
    if "embed" in args.endpoints and set(args.servers) - set(OUR_SERVERS) - set(args.ablations):
        p.error(f"/embed has no plain ORT or pipeline peer here: --servers must name some of {OUR_SERVERS}")
    try:
        args.server_env = dict(item.split("=", 1) for item in args.server_env)
    except ValueError:
        p.error("--server-env takes NAME=VALUE")
    levels = args.concurrency or ("1,8" if args.quick else "1,8,32,64")
    try:
        args.concurrency = [int(c) for c in levels.split(",") if c.strip()]
    except ValueError:
        p.error(f"--concurrency {levels!r} is not a comma list of integers")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency levels must be >= 1")
    args.duration = args.duration or (2.0 if args.quick else 20.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 5.0)
    args.model_seconds = args.model_seconds or (1.0 if args.quick else 10.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    models: dict[str, tuple[Path, str | None]] = {
        "classify": (args.classify_bundle, args.classify_checkpoint),
        "qa": (args.qa_bundle, args.qa_checkpoint),
        "embed": (args.embed_bundle, None),
    }
    if args.dev_models:
        built = common.build_dev_models(args.endpoints, args.work_dir)
        models = {task: (bundle, str(checkpoint)) for task, (checkpoint, bundle) in built.items()}
    report: dict[str, Any] = {
        "created_at": common.now(),
        "machine": common.machine_info(args.threads or None),
        "settings": {
            "command": "python -m benchmarks.service_bench "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "quick": args.quick,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "model_seconds": args.model_seconds,
            "cpu_variant": args.cpu_variant,
            "threads": args.threads,
            "instances": args.instances,
            "server_env": args.server_env,
            "seed": args.seed,
            "rounds": args.rounds,
            "servers": args.servers,
            "dev_models": args.dev_models,
            "targets": service_report.TARGETS,
        },
        "endpoints": {},
    }
    for endpoint in args.endpoints:
        bundle = common.require_bundle(Path(models[endpoint][0]), endpoint)
        checkpoint, how = Path("-"), "not needed: no pipeline server"
        if "pipeline" in args.servers:
            checkpoint, how = common.resolve_checkpoint(bundle, models[endpoint][1], endpoint, args.work_dir)
        print(f"/{endpoint}: bundle {bundle}, baseline checkpoint {checkpoint} ({how})", flush=True)
        report["endpoints"][endpoint] = run_endpoint(endpoint, bundle, checkpoint, how, args)
    stem = args.name or ("service_quick" if args.quick else "service")
    common.write_results(
        args.out,
        stem,
        report,
        service_report.markdown(report),
        lambda path: service_report.plot(report, path),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
