"""The CPU a request costs the service outside the model, this tree against a baseline commit's, in
one process each: the ASGI app called directly (no sockets, no HTTP parser), every default bundle
loaded, ONNX Runtime's `run` stubbed to answer at once with outputs of the right shapes. What is
left is the front end, the engine boundary, the batcher and the thread hand-offs, measured as
process CPU time (all threads) and the event loop thread's, per request, in alternating rounds.
CPU time, not wall time: it holds still on a machine that other jobs share.

    python -m benchmarks.boundary_cpu --baseline layout-v1 --models-dir .cache/bundles
    python -m benchmarks.boundary_cpu --quick ...        # 2 rounds of 200 requests: a smoke run

Each tree runs in its own worker process (`--worker TREE`), which the parent drives round by round
over its stdin/stdout. Results: benchmarks/results/boundary_cpu.*
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENDPOINTS = ("classify", "embed")


# ---------------------------------------------------------------------- worker (one tree)


def stub_model_runs() -> None:
    """ONNX Runtime's `run` answers at once with outputs of the right shapes (from the graph's
    symbolic dims, bound by the feed) and a constant value: the model costs nothing, and everything
    around it (padding, splitting, pooling, post-processing) sees arrays of the real shapes."""
    import numpy as np
    import onnxruntime as ort

    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16}

    graphs: dict[int, tuple[list, dict]] = {}  # session -> its inputs' and outputs' (name, shape, type)

    def run(self: Any, output_names: Any, feed: dict, options: Any = None) -> list:
        if id(self) not in graphs:
            outputs = {o.name: (o.shape, dtypes[o.type]) for o in self.get_outputs()}
            graphs[id(self)] = ([(i.name, i.shape) for i in self.get_inputs()], outputs)
        inputs, outputs = graphs[id(self)]
        dims: dict[str, int] = {}
        for name, shape in inputs:
            dims.update((d, n) for d, n in zip(shape, feed[name].shape, strict=True) if isinstance(d, str))
        return [
            np.full([dims.get(d, d) for d in outputs[name][0]], 0.1, outputs[name][1])
            for name in output_names or outputs
        ]

    ort.InferenceSession.run = run


class Client:
    """Calls an ASGI app as uvicorn would, minus the socket: one body in, status out."""

    def __init__(self, app: Any):
        self.app, self.state = app, {}

    async def start(self) -> None:
        inbox: asyncio.Queue = asyncio.Queue()
        started = asyncio.get_running_loop().create_future()
        await inbox.put({"type": "lifespan.startup"})

        async def send(message: dict) -> None:
            if message["type"].startswith("lifespan.startup") and not started.done():
                started.set_result(message)

        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        self._lifespan = asyncio.create_task(self.app(scope, inbox.get, send))
        message = await started
        if message["type"] != "lifespan.startup.complete":
            raise SystemExit(f"startup failed: {message}")

    async def request(self, method: str, path: str, body: bytes = b"") -> int:
        headers = [(b"host", b"bench"), (b"content-type", b"application/json")]
        headers.append((b"content-length", str(len(body)).encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "state": dict(self.state),
        }
        sent = False
        never = asyncio.get_running_loop().create_future()  # the client never goes away
        status = 0

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await never

        async def send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await self.app(scope, receive, send)
        never.cancel()
        return status


# --callgrind: the worker counts instructions only while it serves an order (valgrind's client
# requests; outside valgrind they do nothing). Exact where the timing decides nothing (c=1).
TOGGLE_C = r"""
#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
"""
TOGGLE_ENV = "BOUNDARY_CALLGRIND"


class NoCounter:
    def start(self) -> None: ...

    def stop(self) -> None: ...


def callgrind_toggle() -> Any:
    import ctypes

    path = os.environ.get(TOGGLE_ENV)
    return ctypes.CDLL(path) if path else NoCounter()


def build_toggle(into: Path) -> Path:
    (into / "toggle.c").write_text(TOGGLE_C)
    command = ["cc", "-O1", "-shared", "-fPIC", "-o", str(into / "toggle.so"), str(into / "toggle.c")]
    subprocess.run(command, check=True)
    return into / "toggle.so"


def instructions(dumps: Path, pid: int) -> int:
    """The instructions of the worker's latest callgrind dump (every thread)."""
    latest = max(dumps.glob(f"callgrind.{pid}.*"), key=lambda p: p.stat().st_mtime_ns)
    for line in reversed(latest.read_text().splitlines()):
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {latest}")


async def worker(tree: str) -> None:
    stub_model_runs()
    import app.main
    from benchmarks.loadgen_payloads import make_payload

    client = Client(app.main.app)
    await client.start()
    deadline = time.monotonic() + 900
    while await client.request("GET", "/ready") != 200:
        if time.monotonic() > deadline:
            raise SystemExit("not ready after 900 s")
        await asyncio.sleep(0.5)
    rng = random.Random(0)
    bodies = {e: [json.dumps(make_payload(e, rng)).encode() for _ in range(256)] for e in ENDPOINTS}

    async def closed_loop(endpoint: str, clients: int, requests: int) -> int:
        failed = 0
        counter = iter(range(requests))

        async def one() -> None:
            nonlocal failed
            for n in counter:
                failed += await client.request("POST", f"/{endpoint}", bodies[endpoint][n % 256]) != 200

        await asyncio.gather(*(one() for _ in range(clients)))
        return failed

    for endpoint in ENDPOINTS:  # every body once: the warm path
        await closed_loop(endpoint, 1, 256)
    print(json.dumps({"ready": tree}), flush=True)
    loop = asyncio.get_running_loop()
    counter = callgrind_toggle()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        order = json.loads(line)
        counter.start()
        process, thread, wall = time.process_time(), time.thread_time(), time.perf_counter()
        failed = await closed_loop(order["endpoint"], order["clients"], order["requests"])
        counter.stop()
        result = {
            "process_ms": (time.process_time() - process) * 1000 / order["requests"],
            "loop_ms": (time.thread_time() - thread) * 1000 / order["requests"],
            "wall_ms": (time.perf_counter() - wall) * 1000 / order["requests"],
            "failed": failed,
        }
        print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------- parent (both trees, alternating)


def start_worker(tree: Path, models_dir: Path, log: Path, toggle: Path | None) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchmarks.boundary_cpu", "--worker", str(tree)]
    if toggle is not None:
        out = f"--callgrind-out-file={log.parent}/callgrind.%p"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", out, *command]
    env = {
        **os.environ,
        "MODELS_DIR": str(models_dir),
        "LOG_LEVEL": "WARNING",
        "DEVICE": "cpu",
        "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}",  # the tree's app, this tree's benchmarks
        **({TOGGLE_ENV: str(toggle)} if toggle is not None else {}),
    }
    return subprocess.Popen(
        command,
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(log, "wb"),  # noqa: SIM115 - the worker's whole life
        text=True,
    )


def ask(proc: subprocess.Popen, order: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(order) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"worker exited ({proc.wait()})")
    return json.loads(line)


def main(argv: list[str] | None = None) -> int:
    from benchmarks import bench_common as common
    from benchmarks.engine_split import extract, git

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", default="layout-v1", help="git ref of the single-process baseline")
    parser.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "bundles")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--callgrind", action="store_true", help="count instructions (valgrind): slow, exact")
    parser.add_argument("--name", default="boundary_cpu")
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(worker(args.worker))
        return 0
    if args.quick:
        args.rounds, args.requests = 2, 200
    levels = [int(c) for c in args.concurrency.split(",")]
    baseline = git(ROOT, "rev-parse", "--short", args.baseline)
    head = git(ROOT, "rev-parse", "--short", "HEAD")
    if git(ROOT, "status", "--porcelain", "--", "app", "processing", "export"):
        head += " with uncommitted changes"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": extract(args.baseline, Path(tmp)), "this tree": ROOT}
        toggle = build_toggle(Path(tmp)) if args.callgrind else None
        workers = {
            name: start_worker(tree, args.models_dir.resolve(), Path(tmp) / f"{i}.log", toggle)
            for i, (name, tree) in enumerate(trees.items())
        }
        try:
            for name, proc in workers.items():  # one at a time: loading is CPU-bound
                assert proc.stdout is not None
                if not proc.stdout.readline():
                    raise SystemExit(f"{name} worker failed: {(Path(tmp) / '0.log').read_text()[-2000:]}")
            for round_ in range(args.rounds):
                for endpoint in ENDPOINTS:
                    for clients in levels:
                        order = list(workers) if round_ % 2 == 0 else list(workers)[::-1]
                        for name in order:
                            request = {"endpoint": endpoint, "clients": clients, "requests": args.requests}
                            result = ask(workers[name], request)
                            if toggle is not None:
                                count = instructions(Path(tmp), workers[name].pid)
                                result["instructions"] = count / args.requests
                            rows.append({"tree": name, "round": round_, **request, **result})
                            print(rows[-1], flush=True)
        finally:
            for proc in workers.values():
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=120)
    summary = []
    for endpoint in ENDPOINTS:
        for clients in levels:
            cell: dict[str, Any] = {"endpoint": endpoint, "clients": clients}
            for name in trees:
                mine = [
                    r for r in rows if (r["tree"], r["endpoint"], r["clients"]) == (name, endpoint, clients)
                ]
                for key in ("process_ms", "loop_ms", "instructions"):
                    if key in mine[0]:
                        cell[f"{name}:{key}"] = round(median(r[key] for r in mine), 4)
                cell[f"{name}:failed"] = sum(r["failed"] for r in mine)
            cell["difference_ms"] = round(cell["this tree:process_ms"] - cell["baseline:process_ms"], 4)
            summary.append(cell)
    report = {
        "command": common.command("boundary_cpu", argv if argv is not None else sys.argv[1:]),
        "baseline": f"{args.baseline} ({baseline})",
        "this_tree": head,
        "machine": common.machine_info(),
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "summary": summary,
        "rows": rows,
    }
    counted = toggle is not None
    how = (
        "under valgrind's callgrind (every thread's instructions; the CPU times are valgrind's, "
        "only their ratios mean anything)"
        if counted
        else "CPU ms per request: the process (every thread) and its event loop thread"
    )
    lines = [
        f"# CPU per request outside the model: {head} against {report['baseline']}",
        "",
        f"`{report['command']}`; {common.machine_line(report['machine'])}. In-process ASGI calls, every "
        "default bundle loaded, the model's `run` stubbed (outputs of the right shapes at once); medians "
        f"of {args.rounds} alternating rounds of {args.requests} requests; {how}.",
        "",
        "| endpoint | c | baseline process ms | this tree process ms | difference ms | baseline loop ms "
        "| this tree loop ms |"
        + (" baseline instructions | this tree instructions | ratio |" if counted else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|---|" if counted else ""),
    ]
    for c in summary:
        line = (
            f"| /{c['endpoint']} | {c['clients']} | {c['baseline:process_ms']:.3f} "
            f"| {c['this tree:process_ms']:.3f} | {c['difference_ms']:+.3f} "
            f"| {c['baseline:loop_ms']:.3f} | {c['this tree:loop_ms']:.3f} |"
        )
        if counted:
            ours, theirs = c["this tree:instructions"], c["baseline:instructions"]
            line += f" {theirs:,.0f} | {ours:,.0f} | {ours / theirs:.3f} |"
        lines.append(line)
    common.write_results(ROOT / "benchmarks" / "results", args.name, report, "\n".join(lines), None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
