"""The front-end ceiling on a simulated accelerator (DEVICE=simulated: a batch takes a fixed time and
no CPU, as on a GPU): short /embed at c=64 through one process, and through 1 and 2 front ends with
one engine process (API_SERVERS), in alternating rounds; each process's CPU per request (front
ends, engine, this load generator) and the rate that budget allows on 2 and on 16 cores.

    python -m benchmarks.split_sim --models-dir .cache/bundles
    python -m benchmarks.split_sim --quick ...

Results: benchmarks/results/split_sim.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

import psutil

from benchmarks import bench_common as common
from benchmarks.engine_split import closed_loop, wait_ready

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MODEL = "all-minilm-l6-v2"
CONFIGS = {"one process": 1, "1 front end + engine": -1, "2 front ends + engine": 2}


def start(models_dir: Path, servers: int, log: Path, batch_ms: float) -> tuple[subprocess.Popen, str]:
    port = common.free_port()
    env = {
        **os.environ,
        "MODELS_DIR": str(models_dir),
        "DEVICE": "simulated",
        "SIMULATED_BATCH_MS": str(batch_ms),
        "LOG_LEVEL": "WARNING",
        "API_SERVERS": str(abs(servers)),
    }
    command = [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port)]
    if servers == -1:  # one front end behind the engine process: the supervisor, with API_SERVERS=1 forced
        command = [
            sys.executable,
            "-c",
            "from app.serve import Supervisor; import sys; "
            f"sys.exit(Supervisor(1, '127.0.0.1', {port}, 30).run())",
        ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def roles(proc: subprocess.Popen, log: Path) -> dict[str, list[int]]:
    """The server's processes by role: the front ends and the engine (one process: both at once)."""
    found = re.findall(r"front ends \[([\d, ]+)\], engine (\d+)", log.read_text(errors="replace"))
    if not found:
        return {"front ends": [proc.pid], "engine": []}
    return {"front ends": [int(p) for p in found[-1][0].split(",")], "engine": [int(found[-1][1])]}


def cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(proc, url: str, log: Path, clients: int, duration_s: float, seed: int) -> dict[str, Any]:
    asyncio.run(closed_loop(url, "embed", clients, 1.0, seed))
    by_role = roles(proc, log)
    before = {role: cpu(pids) for role, pids in by_role.items()} | {"load generator": own_cpu()}
    result = asyncio.run(closed_loop(url, "embed", clients, duration_s, seed))
    after = {role: cpu(pids) for role, pids in by_role.items()} | {"load generator": own_cpu()}
    n = max(1, result["requests"])
    result["cpu_ms_per_request"] = {role: (after[role] - before[role]) * 1000 / n for role in before}
    return result


def projection(per_request: dict[str, float], cores: int, front_ends: int) -> float:
    """Requests/s the CPU budget allows: every role's CPU shares the cores, and the engine's event
    loop is one core at most; the front ends' loops are one core each."""
    total = sum(per_request.values()) / 1000
    limits = [cores / total]
    if per_request.get("engine"):
        limits.append(1000 / per_request["engine"])
    limits.append(front_ends * 1000 / per_request["front ends"])
    return min(limits)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    summary = []
    for name, n in CONFIGS.items():
        mine = [r for r in rows if r["config"] == name]
        roles_ = mine[0]["cpu_ms_per_request"]
        per = {role: round(median(r["cpu_ms_per_request"][role] for r in mine), 3) for role in roles_}
        split = n != 1  # one process: its one event loop is front end and engine at once
        summary.append(
            {
                "config": name,
                "rps": round(median(r["rps"] for r in mine), 1),
                "p50_ms": round(median(r["p50_ms"] for r in mine), 2),
                "errors": sum(r["errors"] for r in mine),
                "cpu_ms_per_request": per,
                "budget_rps_2_cores": round(projection(per, 2, abs(n)), 0),
                # 16 cores: the load generator elsewhere; as many front ends as 14 cores hold
                "budget_rps_16_cores": round(
                    projection({**per, "load generator": 0.0}, 16, 14 if split else 1), 0
                ),
            }
        )
    one, single_front = summary[0]["rps"], summary[1]["rps"]
    for cell in summary:
        cell["ratio_vs_one_process"] = round(cell["rps"] / one, 3)
        cell["ratio_vs_one_front_end"] = round(cell["rps"] / single_front, 3)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "bundles")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--batch-ms", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--from-json", type=Path, help="rewrite the report from a results file's rows")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration = 1, 3.0
    if args.from_json:
        old = json.loads(args.from_json.read_text())
        rows, machine, command = old["rows"], old["machine"], old["command"]
    else:
        machine = common.machine_info()  # the load average at the start
        rows = run(args)
        command = common.command("split_sim", argv if argv is not None else sys.argv[1:])
    summary = summarize(rows)
    report = {
        "command": command,
        "machine": machine,
        "clients": args.clients,
        "batch_ms": args.batch_ms,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "summary": summary,
        "rows": rows,
    }
    write(args, report)
    return 0


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        (models / MODEL).symlink_to((args.models_dir / MODEL).resolve(), target_is_directory=True)
        servers = {}
        for name, n in CONFIGS.items():  # one at a time: each has the machine while it is measured
            log = Path(tmp) / f"{n}.log"
            servers[name] = (n, log)
        for round_ in range(args.rounds):
            order = list(CONFIGS) if round_ % 2 == 0 else list(CONFIGS)[::-1]
            for name in order:
                n, log = servers[name]
                proc, url = start(models, n, log, args.batch_ms)
                try:
                    wait_ready(proc, url)
                    result = measure(proc, url, log, args.clients, args.duration, round_)
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
                rows.append({"config": name, "round": round_, **result})
                print(rows[-1], flush=True)
    return rows


def write(args: argparse.Namespace, report: dict[str, Any]) -> None:
    summary = report["summary"]
    lines = [
        "# Front ends on a simulated accelerator (short /embed)",
        "",
        f"`{report['command']}`; {common.machine_line(report['machine'])}. c={args.clients}, "
        f"{args.batch_ms:g} ms per batch of up to 32 (no CPU), medians of {args.rounds} alternating "
        f"rounds of {args.duration:g} s; each configuration alone on the machine while measured.",
        "",
        "| configuration | req/s | vs one process | vs 1 front end + engine | p50 ms "
        "| CPU ms/req: front ends / engine / load generator | budget on 2 cores | projected on 16 cores |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in summary:
        per = c["cpu_ms_per_request"]
        lines.append(
            f"| {c['config']} | {c['rps']} | {c['ratio_vs_one_process']} | {c['ratio_vs_one_front_end']} "
            f"| {c['p50_ms']} "
            f"| {per['front ends']} / {per.get('engine', 0)} / {per['load generator']} "
            f"| {c['budget_rps_2_cores']:.0f} | {c['budget_rps_16_cores']:.0f} |"
        )
    lines += [
        "",
        "Budget: the rate at which the measured CPU per request fills the cores (the engine's and each "
        "front end's event loop at most one core each). Projected on 16 cores: the same costs, the load "
        "generator elsewhere, 14 front ends (the engine's process takes the rest); one process has one loop "
        "for both sides. The engine's loop (its CPU per request) is then the ceiling.",
    ]

    def plot(path: Path) -> None:
        plt = common.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar([c["config"] for c in summary], [c["rps"] for c in summary])
        ax.set_ylabel(f"short /embed req/s at c={args.clients}")
        common.save_figure(fig, path)

    common.write_results(RESULTS, "split_sim", report, "\n".join(lines), plot)


if __name__ == "__main__":
    raise SystemExit(main())
