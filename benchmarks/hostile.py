"""Hostile clients beside a steady one (issue 42): what an attacker costs a well-behaved client.

    python -m benchmarks.hostile --models-dir .cache/bundles --before main

One server (with API_KEY, and `ulimit -n 1024` as in the issue) serves sst2-minilm and
squad-minilm. A steady client sends one small keyed /classify at a time from its own process,
throughout; one attack runs at a time beside it, each for --phase-s seconds:

- idle: 1,030 connections that send nothing (re-opened whenever the server closes one);
- slow headers: 500 connections that send a header byte a second;
- slow bodies: 300 connections that send 1 MiB minus 10 bytes of a body and stall;
- pre-auth flood: 8 clients sending 900 kB /classify bodies (56k inputs) with no key, each waiting
  for its answer before the next; and the same from 256 clients;
- keyed list flood: the same bodies from 8 keyed clients (refused by their list's length);
- V2 flood: 8 keyed clients sending V2 binary bodies of 200k zero-length BYTES elements;
- huge QA: 6 keyed /qa requests with 100k-character contexts at once (waited for up to 120 s).

The steady client opens a new connection for each request, as probes and short-lived clients do.

Reported per phase: the steady client's p50/p99 and failures, the server's RSS (before, peak
during, after), and what the attackers got back. With --before REF the same run is made first on
that git revision's code (`git archive`), and the report puts both side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import os
import resource
import struct
import subprocess
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks.loadgen import percentiles
from benchmarks.nofile import under_nofile

KEY = "hostile-benchmark-key"
MODELS = ("sst2-minilm", "squad-minilm")
NOFILE = 1024
SMALL = json.dumps({"text": "a fine, moving film", "model": "sst2-minilm"}).encode()


# ---------------------------------------------------------------------------------- the server
def start_server(
    tree: Path, models_dir: Path, log: Path, port: int, settings: dict[str, str]
) -> subprocess.Popen:
    command = common.uvicorn_command(port, tree)
    env = {**os.environ, "MODELS_DIR": str(models_dir), "API_KEY": KEY, "LOG_LEVEL": "WARNING", **settings}
    env["PYTHONPATH"] = str(tree)
    return subprocess.Popen(
        under_nofile(command, NOFILE), cwd=tree, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server on port {port} not ready (exit status {proc.poll()})")


# ---------------------------------------------------------------------------------- raw HTTP
def request(path: str, body: bytes, key: bool = True, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {KEY}\r\n" if key else ""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def exchange(port: int, data: bytes, timeout_s: float = 120) -> tuple[int, float]:
    """One request on a fresh connection: (status, or 0 when the connection failed; seconds)."""
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        writer.write(data)
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        writer.close()
        status = int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else 0
    except (OSError, asyncio.TimeoutError, IndexError, ValueError):
        status = 0
    return status, time.perf_counter() - started


# ---------------------------------------------------------------------------------- the steady client
def steady(port: int, stop: Any, out: Any) -> None:
    """A closed loop of small keyed /classify, each on a new connection as a probe or a short-lived
    client opens one (what running out of descriptors refuses): (t, latency s, status)."""
    import http.client

    rows = []
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", "Connection": "close"}
    while not stop.is_set():
        started = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", "/classify", SMALL, headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except OSError:
            status = 0
        finally:
            conn.close()
        rows.append((started, time.time() - started, status))
        time.sleep(0.01)
    out.send(rows)


# ---------------------------------------------------------------------------------- the attacks
async def hold_connections(
    port: int, n: int, until: float, first: bytes = b"", trickle: bytes = b""
) -> Counter:
    """n connections that send `first`, then a byte of `trickle` a second, until the server answers
    or closes; each is opened again at once, until `until`. Counts what the server did."""
    seen: Counter = Counter()

    async def hold() -> None:
        while time.time() < until:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            except (OSError, asyncio.TimeoutError):
                seen["connect failed"] += 1
                await asyncio.sleep(0.2)
                continue
            try:
                writer.write(first)
                for i in range(10**6):
                    if time.time() >= until:
                        seen["still held"] += 1
                        break
                    if i < len(trickle):
                        writer.write(trickle[i : i + 1])
                    try:
                        line = await asyncio.wait_for(reader.readline(), 1.0)
                    except asyncio.TimeoutError:
                        continue
                    seen[line.split()[1].decode() if line.startswith(b"HTTP/1.1 ") else "closed"] += 1
                    break
            except OSError:
                seen["reset"] += 1
            finally:
                writer.close()

    await asyncio.gather(*(hold() for _ in range(n)))
    return seen


async def flood(port: int, data: bytes, clients: int, until: float) -> Counter:
    seen: Counter = Counter()

    async def client() -> None:
        while time.time() < until:
            status, _ = await exchange(port, data, timeout_s=30)
            seen[status] += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return seen


def v2_flood_body() -> bytes:
    raw = struct.pack("<I", 0) * 200_000
    header = json.dumps({"inputs": [{"name": "text", "shape": [200_000], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()  # fmt: skip
    extra = f"Inference-Header-Content-Length: {len(header)}\r\n"
    return request("/v2/models/sst2-minilm/infer", header + raw, extra=extra).replace(
        b"application/json", b"application/octet-stream", 1
    )


async def huge_qa(port: int) -> Counter:
    context = ("John Smith lives in Paris and works at the museum. " * 2000)[:100_000]
    body = json.dumps({"question": "Where does John live?", "context": context, "model": "squad-minilm"})
    answers = await asyncio.gather(*(exchange(port, request("/qa", body.encode())) for _ in range(6)))
    return Counter(f"{status} in {seconds:.0f} s" for status, seconds in answers)


def attacks(port: int, phase_s: float) -> list[tuple[str, Any]]:
    slow_body = request("/classify", b"a" * (1 << 20))[:-10]
    huge_list = json.dumps({"inputs": [{"text": "x"}] * 56_000}).encode()
    keyless, keyed = request("/classify", huge_list, key=False), request("/classify", huge_list)
    return [
        ("idle connections", lambda until: hold_connections(port, NOFILE + 6, until)),
        (
            "slow headers",
            lambda until: hold_connections(port, 500, until, b"POST /classify HTTP/1.1\r\n", b"X" * 600),
        ),
        ("slow bodies", lambda until: hold_connections(port, 300, until, slow_body)),
        ("pre-auth flood", lambda until: flood(port, keyless, 8, until)),
        ("pre-auth flood, 256 clients", lambda until: flood(port, keyless, 256, until)),
        ("keyed list flood", lambda until: flood(port, keyed, 8, until)),
        ("V2 flood", lambda until: flood(port, v2_flood_body(), 8, until)),
        ("huge QA", lambda until: huge_qa(port)),
    ]


# ---------------------------------------------------------------------------------- one run
async def run_phases(
    port: int, pid: int, phase_s: float, only: set[str]
) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    rss: list[tuple[float, float]] = []

    async def sample(until: float) -> None:
        while time.time() < until:
            rss.append((time.time(), common.tree_rss_mb(pid)))
            await asyncio.sleep(0.5)

    phases = []
    for name, attack in [("baseline", None), *attacks(port, phase_s)]:
        if only and name != "baseline" and name not in only:
            continue
        before, cpu = common.tree_rss_mb(pid), tree_cpu_s(pid)
        start = time.time()
        until = start + phase_s
        work = [sample(until)] + ([attack(until)] if attack else [])
        outcome = (await asyncio.gather(*work))[1:]
        end = time.time()
        cpu = (tree_cpu_s(pid) - cpu) / (end - start)
        await asyncio.sleep(3)  # the attack's connections close; the server settles
        got = {str(k): v for k, v in (outcome[0] if outcome else {}).items()}
        after = common.tree_rss_mb(pid)
        phases.append(
            {"phase": name, "start": start, "end": end, "rss_before_mb": before, "rss_after_mb": after,
             "server_cpu": round(cpu, 3), "attackers_got": got}
        )  # fmt: skip
    return phases, rss


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the server and its children so far (tree_rss_mb's walk)."""
    import psutil

    process = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


def one_run(
    tree: Path, models_dir: Path, phase_s: float, log: Path, only: set[str], settings: dict[str, str]
) -> dict[str, Any]:
    port = common.free_port()
    proc = start_server(tree, models_dir, log, port, settings)
    try:
        wait_ready(port, proc)
        stop, (receive, send) = multiprocessing.Event(), multiprocessing.Pipe(duplex=False)
        client = multiprocessing.Process(target=steady, args=(port, stop, send))
        client.start()
        time.sleep(2)
        phases, rss = asyncio.run(run_phases(port, proc.pid, phase_s, only))
        stop.set()
        rows = receive.recv()
        client.join()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    for phase in phases:
        inside = [r for r in rows if phase["start"] <= r[0] <= phase["end"]]
        stats = percentiles([r[1] for r in inside if r[2] == 200])
        peak = max([m for t, m in rss if phase["start"] <= t <= phase["end"]], default=None)
        failed = sum(r[2] != 200 for r in inside)
        phase.update(requests=len(inside), failed=failed, rss_peak_mb=peak)
        phase.update(p50_ms=stats["p50"], p99_ms=stats["p99"], max_ms=stats["max"])
    t0 = phases[0]["start"]
    return {"phases": phases, "rows": [(round(t - t0, 3), round(lat * 1000, 2), s) for t, lat, s in rows],
            "rss": [(round(t - t0, 2), m) for t, m in rss]}  # fmt: skip


def archive(ref: str, into: Path) -> Path:
    data = subprocess.run(["git", "archive", ref], cwd=common.ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


# ---------------------------------------------------------------------------------- report
def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def table(runs: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| phase | code | steady p50 ms | p99 ms | max ms | steady failed / sent "
        "| server CPU, cores | RSS before → peak → after MB | attackers got |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i in range(len(next(iter(runs.values()))["phases"])):
        for code, run in runs.items():
            p = run["phases"][i]
            got = ", ".join(f"{k}: {v}" for k, v in sorted(p["attackers_got"].items())) or "–"
            rss = f"{p['rss_before_mb']:.0f} → {fmt(p['rss_peak_mb'])} → {p['rss_after_mb']:.0f}"
            lines.append(
                f"| {p['phase']} | {code} | {fmt(p['p50_ms'])} | {fmt(p['p99_ms'])} | {fmt(p['max_ms'])} "
                f"| {p['failed']} / {p['requests']} | {p.get('server_cpu', '–')} | {rss} | {got} |"
            )
    return lines


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(2, len(runs), figsize=(7 * len(runs), 7), squeeze=False, sharex="col")
    for col, (code, run) in enumerate(runs.items()):
        top, bottom = axes[0][col], axes[1][col]
        ok = [(t, lat) for t, lat, s in run["rows"] if s == 200]
        bad = [(t, 1) for t, _, s in run["rows"] if s != 200]
        top.scatter(*zip(*ok, strict=True), s=2, label="steady client, answered")
        if bad:
            top.scatter(*zip(*bad, strict=True), s=12, c="red", marker="x", label="steady client, failed")
        t0 = run["phases"][0]["start"]
        for p in run["phases"]:
            for ax in (top, bottom):
                ax.axvspan(p["start"] - t0, p["end"] - t0, alpha=0.08)
            top.annotate(p["phase"], (p["start"] - t0, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                         va="top", fontsize=7)  # fmt: skip
        top.set(yscale="log", ylabel="latency, ms", title=f"{code}: a small keyed /classify, one at a time")
        top.legend(loc="lower right", fontsize=7)
        bottom.plot(*zip(*run["rss"], strict=True))
        bottom.set(xlabel="seconds", ylabel="server RSS, MB", title=f"{code}: server memory")
    common.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models-dir", type=Path, default=common.ROOT / ".cache" / "bundles")
    parser.add_argument("--before", help="a git revision to run first, as the 'before' column (e.g. main)")
    parser.add_argument("--phase-s", type=float, default=8.0)
    parser.add_argument("--only", action="append", default=[], help="an attack to run (repeat; default all)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a server setting")
    parser.add_argument("--name", default="hostile", help="results file name")
    parser.add_argument("--out", type=Path, default=common.ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))  # our own ~1,100 sockets
    machine = common.machine_info()
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        for name in MODELS:
            (models / name).symlink_to((args.models_dir / name).resolve())
        trees = (
            [(f"before ({args.before})", archive(args.before, Path(tmp) / "before"))] if args.before else []
        )
        for code, tree in [*trees, ("this code", common.ROOT)]:
            print(f"{code}: serving {', '.join(MODELS)}", flush=True)
            log = Path(tmp) / f"{len(runs)}.log"
            runs[code] = one_run(tree, models, args.phase_s, log, set(args.only), settings)
    report = {"command": common.command("hostile", argv), "date": common.now(), "machine": machine,
              "phase_s": args.phase_s, "nofile": NOFILE, "runs": runs}  # fmt: skip
    text = "\n".join([
        "# Hostile clients beside a steady one", "",
        f"`{report['command']}` on {report['date']}. Machine: {common.machine_line(machine)}.", "",
        f"Server: sst2-minilm and squad-minilm, API_KEY set, `ulimit -n {NOFILE}`, "
        f"{''.join(f'`{k}={v}`, ' for k, v in settings.items())}otherwise the defaults. "
        f"Each attack runs {args.phase_s:g} s (huge QA: until its 6 requests are answered) beside a steady "
        "client that sends one small keyed /classify at a time; percentiles are of its answered requests in "
        "the phase. `0` among what attackers got: connection failed or still held at the end.", "",
        *table(runs), "", f"![steady client latency and server RSS per phase]({args.name}.png)",
    ])  # fmt: skip
    common.write_results(args.out, args.name, report, text, lambda path: plot(runs, path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
