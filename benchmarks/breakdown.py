"""Where one request's time goes: per stage, at concurrency 1 and 32, for /classify, /embed and /qa
(method: docs/performance.md, section 1). py-spy needs ptrace (root, or CAP_SYS_PTRACE).

    .venv/bin/python -m benchmarks.breakdown                      # ~6 min, all three endpoints
    .venv/bin/python -m benchmarks.breakdown --endpoints classify --duration 5
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks.service_bench import load_levels, our_server

ENDPOINTS = ("classify", "embed", "qa")
BUNDLES = {"classify": "sst2-minilm", "embed": "all-minilm-l6-v2", "qa": "squad-minilm"}

# (stage, function pattern, file pattern): a sample goes to the first rule matching its innermost
# frame, else the next frame out, and so on. Order matters only within one frame.
RULES: list[tuple[str, str, str]] = [
    ("ORT run", r".*", r"onnxruntime/"),
    ("ORT run", r"^(OrtRuntime\.)?(run|run_alone|_run_bound)$|^RuntimePool\.run", r"app/.*runtime\.py"),
    (
        "collate/pad",
        r"pad_batch|pad_choices|pad_items|split_rows|collate|<lambda>",
        r"processing/padding\.py|app/.*(loader|reduce)\.py",
    ),
    ("tokenize", r"encode|tokeni[sz]e|make_windows|token_spans|_encode", r"processing/|app/"),
    ("decode", r".*", r"processing/"),
    ("serialize", r"serialize_response|jsonable_encoder|render|dumps|dump_json|_prepare_response", r".*"),
    ("serialize", r"JSONResponse\.__init__|Response\.__init__|init_headers", r"starlette/responses\.py"),
    ("write", r"send|write", r"uvicorn/protocols/http/|asyncio/(selector_events|transports)\.py"),
    ("write", r"Response\.__call__", r"starlette/responses\.py"),
    ("parse", r"^(Request\.)?(json|body|stream)$|loads|decode", r"starlette/requests\.py|json/|fastapi/"),
    ("parse", r"replay|BodyLimitMiddleware", r"app/.*middleware\.py"),
    ("validate", r"validate|request_body_to_args|solve_dependencies|_get_value|check_chars", r".*"),
    ("admission/queue", r".*", r"app/.*(batcher|batch_types|scheduling)\.py"),
    ("admission/queue", r"AdmissionMiddleware|lease|infer|gather_all", r"app/"),
    ("metrics/logs", r".*", r"prometheus_client/|logging/|app/.*(logs|metrics)\.py"),
    ("http in (uvicorn)", r"^(?!.*run_asgi).*", r"uvicorn/protocols/http/|httptools"),
    ("routing/middleware", r".*", r"starlette/|fastapi/|app/.*middleware\.py|app/.*routes\.py"),
    ("service glue", r".*", r"app/"),
    ("asyncio machinery", r".*", r"asyncio/|uvloop/|contextvars"),
]
STAGES = ["parse", "validate", "tokenize", "admission/queue", "collate/pad", "ORT run", "decode", "serialize"]
STAGES += ["write", "http in (uvicorn)", "routing/middleware", "metrics/logs", "service glue"]
STAGES += ["asyncio machinery", "other", "idle"]
RATE = 200  # py-spy samples per second
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::\d+)?\)$")
# The log writer waits in SimpleQueue.get, a C call: its own frame is then the innermost.
IDLE_LEAVES = re.compile(
    r"Runner\.run \(asyncio/runners\.py|run \(uvloop/|threading\.py|queue\.py|concurrent/futures/thread\.py"
    r"|LogWriter\._run \(app/observe/logs\.py"
)
_COMPILED = [(stage, re.compile(f), re.compile(p)) for stage, f, p in RULES]


def stage_of(frames: list[str]) -> str:
    """The stage of one sample: its innermost frame that a rule names; idle when the thread waits."""
    if not frames or IDLE_LEAVES.search(frames[-1]):
        return "idle"
    for frame in reversed(frames):
        match = FRAME.match(frame)
        if match is None:
            continue
        for stage, func, path in _COMPILED:
            if path.search(match["file"]) and func.search(match["func"]):
                return stage
    return "other"


def parse_raw(text: str) -> dict[str, Counter]:
    """py-spy's raw output ("thread (tid): name;frame;...;frame count") -> {thread kind: Counter(stage)}."""
    threads: dict[str, Counter] = {"event loop": Counter(), "other threads": Counter()}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, *frames = stack.split(";")
        # The head names the thread; the main thread runs the event loop.
        kind = "event loop" if head.endswith(": MainThread") else "other threads"
        threads[kind][stage_of(frames)] += int(count)
    return threads


def per_request_ms(samples: dict[str, Counter], duration_s: float, requests: int) -> dict:
    """Each stage's thread time per request served. The event loop is sampled all the time, so its
    samples per second of wall time convert any thread's samples to seconds."""
    per_s = sum(samples["event loop"].values()) / duration_s if duration_s else 0.0
    if not per_s or not requests:
        return {}
    return {
        kind: {stage: round(1000 * counts[stage] / per_s / requests, 3) for stage in STAGES if counts[stage]}
        for kind, counts in samples.items()
    }


def scrape(url: str) -> dict[str, float]:
    """Sums and counts of the stage histograms (by stage) and the request latency (by endpoint)."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = (
        r'^bert_(stage|request_latency)_seconds_(sum|count)\{[^}]*(?:stage|endpoint)="([^"]+)"[^}]*\} (\S+)$'
    )
    return {f"{m[1]} {m[3]} {m[2]}": float(m[4]) for m in re.finditer(pattern, text, re.M)}


def own_timings(before: dict[str, float], after: dict[str, float], endpoint: str) -> dict[str, float]:
    """The service's mean ms per request of each stage it times, and of the whole request."""
    out = {}
    for name in (key[: -len(" count")] for key in after if key.endswith(" count")):
        kind, label = name.split(" ", 1)
        n = after[f"{name} count"] - before.get(f"{name} count", 0.0)
        if n > 0 and (kind == "stage" or label == f"/{endpoint}"):
            total = after[f"{name} sum"] - before.get(f"{name} sum", 0.0)
            out["server total" if kind != "stage" else label] = round(1000 * total / n, 3)
    return out


@contextlib.contextmanager
def profiled(url: str, pid: int, args: argparse.Namespace, workload: str, level: int, row: dict):
    """py-spy on every thread of the server and its stage timings around one level's load."""
    raw = args.work_dir / "breakdown" / f"{workload}-c{level}.txt"
    raw.parent.mkdir(parents=True, exist_ok=True)
    before = scrape(url)
    spy = subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", str(RATE)]
        + ["--duration", str(int(args.duration)), "--format", "raw", "--threads", "--idle", "--nonblocking"]
        + ["-o", str(raw)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.3)  # py-spy attaches
    yield
    _, err = spy.communicate(timeout=60)
    if spy.returncode != 0:
        raise SystemExit(f"py-spy failed ({spy.returncode}): {err.decode(errors='replace')[-800:]}")
    row["service_timings_ms"] = own_timings(before, scrape(url), workload)
    row["samples"] = parse_raw(raw.read_text())


def run_endpoint(endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    bundle = common.require_bundle(args.bundles_dir / BUNDLES[endpoint], endpoint)
    port = common.free_port()
    url = f"http://127.0.0.1:{port}"
    command, env = our_server([bundle], port, args.work_dir / "models-dir" / f"breakdown-{endpoint}", {})
    print(f"/{endpoint}: {' '.join(command)}", flush=True)
    with common.server(command, env, args.work_dir / "logs" / f"breakdown-{endpoint}.log", url, 300.0) as pid:
        models = httpx.get(f"{url}/models", timeout=10).json()["models"]
        (model,) = [m for m in models if m["status"] == "ready"]
        around = functools.partial(profiled, url, pid, args)
        levels = load_levels(url, pid, [(endpoint, c) for c in args.concurrency], "ours", args, around)
    for row in levels:
        row["profile_ms_per_request"] = per_request_ms(row["samples"], row["elapsed_s"], row["ok"])
        print(f"  c={row['concurrency']:<3} service {row['service_timings_ms']}", flush=True)
    return {"bundle": str(bundle), "model": model, "levels": levels}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Per-stage breakdown of one request",
        "",
        f"`{report['command']}` on {common.machine_line(report['machine'])}.",
        "",
        "Each endpoint's bundle served alone by `uvicorn app.main:app` (its defaults), closed-loop load "
        f"from benchmarks/loadgen.py for {report['duration_s']:g} s per level, py-spy at "
        f"{report['rate']} Hz on every thread (idle included). Profile columns: ms per request = the "
        "stage's samples converted to thread time / requests served ('other threads' summed over "
        "the inference and to_thread workers; idle there counts each idle worker). Service "
        "columns: the service's own stage histograms (Server-Timing). The load generator shares the "
        "cores with the server, and py-spy takes some CPU too: compare rows of one run only.",
        "",
    ]
    for endpoint, entry in report["endpoints"].items():
        lines += [f"## /{endpoint}", ""]
        levels = entry["levels"]
        header = "| stage | " + " | ".join(
            f"c={r['concurrency']} loop ms | c={r['concurrency']} other threads ms" for r in levels
        )
        lines += [header + " |", "|---|" + "---:|---:|" * len(levels)]
        profiles = [r["profile_ms_per_request"] for r in levels]
        for stage in STAGES:
            cells = [p.get(name, {}).get(stage) for p in profiles for name in ("event loop", "other threads")]
            if any(cells):
                row = " | ".join("" if c is None else f"{c:.3f}" for c in cells)
                lines.append(f"| {stage} | {row} |")
        lat = [r["latency_ms"] for r in levels]
        rows = {"throughput, req/s": [f"{r['throughput_rps']:.1f}" for r in levels]}
        rows["client p50 / p99, ms"] = [f"{x['p50']} / {x['p99']}" for x in lat]
        for k in ("server total", "tokenize", "queue", "inference", "postprocess"):
            rows[f"service's own: {k}, mean ms"] = [str(r["service_timings_ms"].get(k, "")) for r in levels]
        lines += ["", "| | " + " | ".join(f"c={r['concurrency']}" for r in levels) + " |"]
        lines += [
            "|---|" + "---:|" * len(levels),
            *(f"| {k} | " + " | ".join(v) + " |" for k, v in rows.items()),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", default=",".join(ENDPOINTS))
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--duration", type=float, default=15.0, help="seconds of profiled load per level")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the first level")
    p.add_argument("--bundles-dir", type=Path, default=common.ROOT / ".cache" / "bundles")
    p.add_argument("--work-dir", type=Path, default=common.WORK)
    p.add_argument("--out", type=Path, default=common.RESULTS)
    p.add_argument("--name", default="breakdown")
    args = p.parse_args(argv)
    args.endpoints = [e for e in args.endpoints.split(",") if e]
    if not args.endpoints or set(args.endpoints) - set(ENDPOINTS):
        p.error(f"--endpoints must name some of {ENDPOINTS}")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    report: dict[str, Any] = {
        "created_at": common.now(),
        "command": common.command("breakdown", argv),
        "machine": common.machine_info(),
        "duration_s": args.duration,
        "rate": RATE,
        "concurrency": args.concurrency,
        "rules": RULES,
        "endpoints": {e: run_endpoint(e, args) for e in args.endpoints},
    }
    common.write_results(args.out, args.name, report, markdown(report), None)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
