"""The service benchmark: our server against its bare model and against the servers users pick instead
(how to read it: benchmarks/README.md; targets and tables: service_report.py).

    python -m benchmarks.service_bench                     # in-repo servers, c=1,8,32,64, 20 s per level
    python -m benchmarks.service_bench --quick             # smoke run: c=1,8, 2 s per level
    python -m benchmarks.service_bench --endpoints embed,classify --servers all --rounds 2 --duration 5 \
        --concurrency 1,32 --name peers                    # every peer, each in its own environment
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.settings import available_cores
from benchmarks import bench_common as common
from benchmarks import loadgen, peer_envs, service_report
from benchmarks.loadgen_payloads import BASE, PATHS, SENTENCES, from_wire, make_payload, to_wire
from export.bundle import MANIFEST_NAME
from export.int8_precision import cpu_int8_variant

# What our server (CPU_VARIANT=auto's choice on this CPU: int8-rowwise-avx2 without VNNI), the plain
# ORT floor and the bare model run.
VARIANT = cpu_int8_variant()[0]
ENDPOINTS = ("classify", "qa", "embed")
# name -> (endpoints, protocol, peer environment, what it is)
SERVERS: dict[str, tuple[tuple[str, ...], str, str | None, str]] = {
    "ours": (ENDPOINTS, "ours", None, "this service, the endpoint's default bundle loaded alone"),
    "ours-no-solo": (ENDPOINTS, "ours", None, "ours with SOLO_SESSION=false"),
    "ours-defaults": (ENDPOINTS, "ours", None, "ours with every default bundle loaded (make serve)"),
    "ort": (("classify", "qa"), "ours", None, "floor: FastAPI + one ORT session on our ONNX file"),
    "pipeline": (("classify", "qa"), "ours", None, "floor: FastAPI + transformers pipeline (torch)"),
    "st": (("embed",), "ours", None, "floor: FastAPI + sentence-transformers (torch)"),
    "infinity-optimum": (("embed",), "openai", "infinity", "Infinity 0.0.77, --engine optimum (ONNX fp32)"),
    "infinity-torch": (("embed",), "openai", "infinity", "Infinity 0.0.77, --engine torch"),
    "optimum": (("embed", "classify"), "ours", "optimum", "Optimum recipe: ORTModel + pipeline in FastAPI"),
    "fastembed": (("embed",), "ours", "fastembed", "fastembed TextEmbedding in FastAPI"),
    "mlserver": (("classify",), "v2", "mlserver", "MLServer + mlserver-huggingface (torch), V2"),
}
IN_REPO = [name for name, spec in SERVERS.items() if spec[2] is None]
PROBE_CLASSIFY = [f"{SENTENCES[i]} {SENTENCES[(i + 5) % len(SENTENCES)]}" for i in range(len(SENTENCES))]


def our_server(bundles: list[Path], port: int, models_dir: Path, env: dict[str, str]) -> tuple[list, dict]:
    """Our server on exactly these bundles (linked into `models_dir`)."""
    shutil.rmtree(models_dir, ignore_errors=True)  # only links live here
    models_dir.mkdir(parents=True)
    for path in bundles:
        (models_dir / path.name).symlink_to(path.resolve(), target_is_directory=True)
    command = f"{sys.executable} -m uvicorn app.main:app --host 127.0.0.1 --port {port} --no-server-header"
    return command.split(), {"MODELS_DIR": str(models_dir), "CPU_VARIANT": VARIANT, "DEVICE": "cpu", **env}


def st_folder(bundle: Path) -> Path:
    """The embed bundle's own sentence-transformers folder (MiniLM's through its link in .cache)."""
    minilm = "minilm" in bundle.name
    return peer_envs.minilm_dir() if minilm else common.resolve_checkpoint(bundle, None, "embed")[0]


def command(name: str, endpoint: str, port: int, entry: dict[str, Any], args) -> tuple[list, dict, str]:
    """(argv, environment, readiness path) of one server for one endpoint. No path here holds a space."""
    bundle, checkpoint, py = Path(entry["bundle"]), entry.get("checkpoint"), sys.executable
    if name in ("ort", "pipeline", "st"):
        floor = {
            "ort": f"pipeline_server --ort --{endpoint} {bundle} --variant {VARIANT}",
            "pipeline": f"pipeline_server --{endpoint} {checkpoint} --bundle {bundle}",
        }.get(name) or f"peer_server st --embed {st_folder(bundle)}"
        return f"{py} -m benchmarks.{floor} --port {port}".split(), {}, "/ready"
    if name.startswith("ours"):  # ours, its variants and ablations
        models_dir = args.work_dir / "models-dir" / endpoint
        bundles = [bundle]
        if name == "ours-defaults":
            bundles = sorted(p for p in bundle.parent.iterdir() if (p / MANIFEST_NAME).is_file())
        env = {"SOLO_SESSION": "false"} if name == "ours-no-solo" else args.ablations.get(name, {})
        return (*our_server(bundles, port, models_dir, env), "/ready")
    return peer_envs.command(name, endpoint, port, checkpoint, args.work_dir)


def probe(url: str, endpoint: str, protocol: str) -> list[Any] | None:
    """The server's answers to fixed inputs: embedding vectors, or (label, score) pairs."""
    import httpx

    if endpoint not in ("embed", "classify"):
        return None
    answers = []
    for text in SENTENCES if endpoint == "embed" else PROBE_CLASSIFY:
        payload = {"inputs": text} if endpoint == "embed" else {"text": text}
        path, body = to_wire(protocol, endpoint, payload)
        reply = httpx.post(url + path, json=body, timeout=60).raise_for_status().json()
        answer = from_wire(protocol, endpoint, reply)
        answers.append(answer[0] if endpoint == "embed" else (answer["label"].lower(), answer["score"]))
    return answers


def compare(endpoint: str, ours: list[Any], theirs: list[Any]) -> dict[str, Any]:
    import numpy as np

    if endpoint == "embed":
        a, b = np.asarray(ours, float), np.asarray(theirs, float)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        return {
            "cosine_min": round(float(cos.min()), 5),
            "cosine_mean": round(float(cos.mean()), 5),
            "agrees": bool(cos.min() >= 0.99),
        }
    labels = sum(x[0] == y[0] for x, y in zip(ours, theirs, strict=True)) / len(ours)
    gap = max((abs(x[1] - y[1]) for x, y in zip(ours, theirs, strict=True) if x[0] == y[0]), default=1.0)
    return {
        "labels_agree": round(labels, 3),
        "score_max_abs_diff": round(gap, 4),
        "agrees": labels == 1.0 and gap < 0.1,  # INT8 (ours) against fp32: up to ~0.06 seen
    }


def per_request_ms(seconds: float, requests: int) -> float | None:
    return round(1000 * seconds / requests, 3) if requests else None


# Our own counters, read from /metrics around each level (a peer has none: zeros).
METRICS = ("bert_cache_hits_total", "bert_cache_misses_total", "bert_batch_size_sum", "bert_batch_size_count")
METRICS += ("bert_batch_padded_tokens_sum",)


def counters(url: str, pid: int) -> tuple[float, ...]:
    """The server's CPU seconds (all, main thread), this process's (the load generator), and the sums
    over label sets of METRICS."""
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        text = ""
    sums = (sum(map(float, re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))) for name in METRICS)
    return common.tree_cpu_seconds(pid), common.main_thread_cpu_seconds(pid), sum(os.times()[:2]), *sums


def load_levels(url: str, pid: int, workloads: list[tuple[str, int]], protocol: str, args, around=None):
    """Warm up, then one closed-loop run per workload with the server's and our CPU accounting.
    `around(workload, level, row)`, a context manager, wraps each level's load and adds to its row."""
    top, first = max(c for _, c in workloads), {workloads[0][0]: 1.0}
    base = loadgen.LoadConfig(url, None, args.warmup, concurrency=top, endpoints=first, timeout_s=120.0)
    base.protocol = protocol
    loadgen.run(base)
    rows = []
    for workload, level in workloads:
        row: dict[str, Any] = {"workload": workload, "concurrency": level}
        before, config = counters(url, pid), replace(base, duration_s=args.duration, concurrency=level)
        with around(workload, level, row) if around else contextlib.nullcontext():
            report = loadgen.run(replace(config, endpoints={workload: 1}))
        delta = [b - a for a, b in zip(before, counters(url, pid), strict=True)]
        cpu, main, client, hits, misses, batch_sizes, batches, padded = delta
        ok, lat = report["ok"], report["latency_ms"]
        keys = "requests ok errors errors_by_status schema_errors elapsed_s throughput_rps".split()
        row |= {k: report[k] for k in keys} | {"latency_ms": lat}
        row["cpu_seconds_per_1000_requests"] = round(1000 * cpu / ok, 3) if ok else None
        # Its main thread (ours: the event loop) and its other threads (ours: inference).
        row["cpu_ms_per_request"] = {
            "main_thread": per_request_ms(main, ok),
            "other_threads": per_request_ms(cpu - main, ok),
            "load_generator": per_request_ms(client, ok),
        }
        if hits + misses:
            row["cache_hit_rate"] = round(hits / (hits + misses), 3)
        if batches and ok:
            row["mean_batch_size"] = round(batch_sizes / batches, 2)
            row["padded_tokens_per_request"] = round(padded / ok, 1)
        rows.append(row)
        print(
            f"    {workload} c={level:<3} {report['throughput_rps']:8.2f} req/s  p50 {lat['p50']} ms  "
            f"p99 {lat['p99']} ms  errors {report['errors']}",
            flush=True,
        )
    return rows


# Causes that the end of a log does not show, found anywhere in it.
CAUSES = {
    "_attention_scale": "optimum 1.x's ONNX exporter imports torch.onnx.symbolic_opset14._attention_scale, "
    "gone in torch 2.13, the only CPU torch installable here (PyPI's older ones pull CUDA). ",
}


def run_server(name: str, endpoint: str, entry: dict[str, Any], args, reference: list | None) -> dict:
    """Start one server, probe it, load it at every workload, stop it; a failure is recorded."""
    port = common.free_port()
    url, log = f"http://127.0.0.1:{port}", args.work_dir / "logs" / f"{endpoint}-{name}.log"
    protocol = SERVERS.get(name, SERVERS["ours"])[1]
    workloads = [(w, c) for w, c in args.workloads if BASE.get(w, w) == endpoint]
    result: dict[str, Any] = {}
    try:
        argv, env, ready = command(name, endpoint, port, entry, args)
        result["command"] = common.repo_relative(" ".join(argv))
        print(f"  {name}: {result['command']}", flush=True)
        started = time.perf_counter()
        with common.server(argv, env, log, url, args.ready_timeout, ready_path=ready) as pid:
            result["ready_seconds"] = round(time.perf_counter() - started, 1)
            if name.startswith("ours"):
                import httpx

                result["models"] = httpx.get(f"{url}/models", timeout=10).json()
            result["probe"] = probe(url, endpoint, protocol)
            if reference is not None and result["probe"] is not None:
                result["answers"] = compare(endpoint, reference, result["probe"])
            result["levels"] = load_levels(url, pid, workloads, protocol, args)
            result["rss_mb_after_load"] = common.tree_rss_mb(pid)
    except (SystemExit, subprocess.CalledProcessError, OSError, ValueError, KeyError) as e:
        text = log.read_text(errors="replace") if log.is_file() else ""
        cause = "".join(why for needle, why in CAUSES.items() if needle in text)
        result["error"] = cause + str(e)[-2000:]
        print(f"    {name} failed: {result['error'][-300:]}", flush=True)
    return result


def model_only(bundle: Path, endpoint: str, args, served: dict[str, int]) -> dict[str, Any]:
    """ORT alone on the same payloads. One request: the session the server runs it on (its solo
    session, with every core, where it has one). Batched: the best over batch sizes and layouts (one
    session with every core; one single-threaded session per core side by side; the server's own)."""
    from benchmarks.model_only import BundleModel, batched_reference, single_request_reference

    rng = random.Random(0)  # the same payload pool the load generator draws from
    payloads = [make_payload(endpoint, rng) for _ in range(loadgen.POOL_SIZE)]
    cores = available_cores()
    solo = served.get("solo_threads")
    single = BundleModel(bundle, VARIANT, solo or served["threads"], solo=bool(solo))
    batched = {}
    for instances, threads in sorted({(served["instances"], served["threads"]), (1, cores), (cores, 1)}):
        model = BundleModel(bundle, VARIANT, threads, instances)
        batched[f"{instances}x{threads}"] = batched_reference(model, payloads, args.model_seconds)
    best = max(batched, key=lambda name: batched[name]["best_requests_per_s"])
    return {
        "variant": VARIANT,
        "cores": cores,
        "threads": served["threads"],
        "single_request_threads": single.threads,
        "single_request": single_request_reference(single, payloads, args.model_seconds),
        "batched": batched[best],
        "batched_layout": best,
        "batched_by_layout": batched,
    }


def run_endpoint(endpoint: str, entry: dict[str, Any], names: list[str], args) -> dict[str, Any]:
    """Every server over alternating rounds (the order rotates; ours first in round one, for the
    reference answers), then the bare model, then the targets."""
    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    reference = None
    for index in range(args.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        if index == 0 and "ours" in order:
            order = ["ours"] + [n for n in order if n != "ours"]
        for name in order:
            if rounds[name] and "error" in rounds[name][0]:
                continue  # it failed once: it fails alike every round
            print(f"/{endpoint} round {index + 1}/{args.rounds}: {name}", flush=True)
            result = run_server(name, endpoint, entry, args, None if name == "ours" else reference)
            reference = result["probe"] if name == "ours" and reference is None else reference
            result.pop("probe", None)
            rounds[name].append(result)
    entry["servers"] = {name: service_report.median_round(results) for name, results in rounds.items()}
    ours = entry["servers"].get("ours", {})
    if "models" in ours:
        (model,) = [m for m in ours["models"]["models"] if m["status"] == "ready"]
        served = {
            "instances": model.get("instances") or 1,
            "threads": model["intra_op_threads"],
            "solo_threads": model.get("solo_threads"),
        }
        print("  model-only ORT reference", flush=True)
        entry["model_only"] = model_only(Path(entry["bundle"]), endpoint, args, served)
    entry["targets"] = service_report.targets(entry)
    return entry


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--quick", action="store_true", help="smoke run: c=1,8, 2 s per level")
    add("--endpoints", default="classify,qa", help="comma list of " + ",".join(ENDPOINTS))
    add("--servers", default=",".join(IN_REPO), help="comma list, or all, of " + ",".join(SERVERS))
    add("--concurrency", help="comma list (default 1,8,32,64; quick 1,8)")
    add(
        "--workloads",
        help="WORKLOAD:CONCURRENCY comma list (loadgen_payloads.PATHS) instead of each endpoint at every "
        "--concurrency level and embed-32:4, e.g. embed-varied:1,embed-varied-32:32 or classify-zipf:8",
    )
    add("--duration", type=float, help="seconds per level (default 20; quick 2)")
    add("--warmup", type=float, help="warm-up seconds per server (default 5; quick 1)")
    add("--model-seconds", type=float, help="seconds per bare-model reference (default 10)")
    add("--rounds", type=int, default=1, help="alternating rounds; each level's median is reported")
    add("--ready-timeout", type=float, default=600.0, help="wait this long for a server to be ready")
    add(
        "--ablation",
        action="append",
        default=[],
        metavar="NAME:SETTING=VALUE[,SETTING=VALUE]",
        help="one more server, ours-NAME: ours with these settings, e.g. quiet:LOG_LEVEL=WARNING",
    )
    for task in ("classify", "qa"):
        add(f"--{task}-bundle", type=Path, default=common.default_bundle(task))
        add(f"--{task}-checkpoint", default="auto", help="auto: the bundle's source checkpoint")
    add("--embed-bundle", type=Path, default=common.ROOT / ".cache/bundles/all-minilm-l6-v2")
    add("--dev-models", action="store_true", help="MiniLM with random heads, not the defaults")
    add("--work-dir", type=Path, default=common.WORK)
    add("--out", type=Path, default=common.RESULTS)
    add("--name", help="results file stem (default service, or service_quick)")
    args = p.parse_args(argv)
    args.endpoints = [e for e in args.endpoints.split(",") if e]
    args.servers = list(SERVERS) if args.servers == "all" else [s for s in args.servers.split(",") if s]
    try:
        args.ablations = {
            f"ours-{name}": dict(item.split("=", 1) for item in settings.split(","))
            for name, _, settings in (a.partition(":") for a in args.ablation)
        }
        levels = args.concurrency or ("1,8" if args.quick else "1,8,32,64")
        args.concurrency = [int(c) for c in levels.split(",")]
        args.workloads = [
            (w, int(c))
            for w, _, c in (item.rpartition(":") for item in (args.workloads or "").split(",") if item)
        ] or [(e, c) for e in args.endpoints for c in args.concurrency] + [("embed-32", 4)]
    except ValueError:
        p.error(
            "--ablation takes NAME:SETTING=VALUE[,SETTING=VALUE]; --concurrency a comma list of integers; "
            "--workloads WORKLOAD:CONCURRENCY items"
        )
    args.servers += [kind for kind in args.ablations if kind not in args.servers]
    if set(w for w, _ in args.workloads) - set(PATHS):
        p.error(f"--workloads must name some of {sorted(PATHS)}")
    if not args.endpoints or set(args.endpoints) - set(ENDPOINTS):
        p.error(f"--endpoints must name some of {ENDPOINTS}")
    if not args.servers or set(args.servers) - set(SERVERS) - set(args.ablations):
        p.error(f"--servers must name some of {list(SERVERS)}")
    if args.rounds < 1 or min(args.concurrency) < 1:
        p.error("--rounds and --concurrency levels must be >= 1")
    args.duration = args.duration or (2.0 if args.quick else 20.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 5.0)
    args.model_seconds = args.model_seconds or (1.0 if args.quick else 10.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    bundles = {
        task: (getattr(args, f"{task}_bundle"), getattr(args, f"{task}_checkpoint", None))
        for task in ENDPOINTS
    }
    if args.dev_models:
        built = common.build_dev_models(args.endpoints, args.work_dir)
        bundles = {task: (bundle, str(checkpoint)) for task, (checkpoint, bundle) in built.items()}
    report: dict[str, Any] = {
        "created_at": common.now(),
        "machine": common.machine_info(),
        "settings": {
            "command": common.command("service_bench", argv),
            **{k: getattr(args, k) for k in ("concurrency", "duration", "warmup", "model_seconds", "rounds")},
            "variant": VARIANT,
            "ablations": args.ablations,
            "targets": service_report.TARGETS,
        },
        "servers": {
            n: SERVERS[n][3] if n in SERVERS else f"ours with {args.ablations[n]}" for n in args.servers
        },
        "environments": {},
        "versions": {},
        "endpoints": {},
    }
    for env_name in dict.fromkeys(SERVERS[n][2] for n in args.servers if n in SERVERS and SERVERS[n][2]):
        try:  # a peer whose environment cannot be made is recorded, not fatal
            peer_envs.ensure(env_name)
            report["versions"][env_name] = peer_envs.versions(env_name, peer_envs.MEASURED)
            report["environments"][env_name] = "ready"
        except SystemExit as e:
            report["environments"][env_name] = f"failed: {e}"
    started = time.perf_counter()
    for endpoint in args.endpoints:
        bundle = common.require_bundle(Path(bundles[endpoint][0]), endpoint)
        entry: dict[str, Any] = {"bundle": str(bundle)}
        names = [n for n in args.servers if endpoint in SERVERS.get(n, SERVERS["ours"])[0]]
        if {"pipeline", "optimum", "mlserver"} & set(names) and endpoint != "embed":
            checkpoint, how = common.resolve_checkpoint(bundle, bundles[endpoint][1], endpoint, args.work_dir)
            entry.update(checkpoint=str(checkpoint), checkpoint_source=how)
        failed = {
            n: {"error": report["environments"][SERVERS[n][2]]}
            for n in names
            if n in SERVERS and report["environments"].get(SERVERS[n][2], "ready") != "ready"
        }
        run_endpoint(endpoint, entry, [n for n in names if n not in failed], args)
        entry["servers"].update(failed)
        report["endpoints"][endpoint] = entry
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    report["load_average_at_end"] = list(os.getloadavg())
    stem = args.name or ("service_quick" if args.quick else "service")
    plot = lambda path: service_report.plot(report, path)  # noqa: E731
    common.write_results(args.out, stem, report, service_report.markdown(report), plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
