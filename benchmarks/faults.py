"""Faults injected into the running deployment under load: kill -9 of a replica, a rolling restart,
and Prometheus' view of it all.

    .venv/bin/python -m benchmarks.faults                          # default bundles, 3 replicas, 32 clients
    .venv/bin/python -m benchmarks.faults --tiny --quick --name faults_smoke   # test-size models, short

Brings up the compose topology locally (deploy/local/stack.py: 3 replicas on MODELS_DIR, nginx with
deploy/nginx/nginx.conf, Prometheus with deploy/prometheus/prometheus.yml), then, with 32 closed-loop
clients sending the loadgen mix (classify, NER, multiple choice, QA) through nginx:

1. steady: no fault. Prometheus, queried through its HTTP API, must show every replica's target up
   and the replicas' request counters must add up to exactly the requests the clients sent;
2. kill -9: one replica is killed mid-load, and started again after a while (compose's restart policy);
3. rolling restart: each replica in turn gets SIGTERM, is started again once it has exited, and the
   roll moves on once it answers /ready.

Every response and every connection error is counted; a run passes when no request failed. The
nginx access log tells how many requests nginx retried on another replica. Writes
benchmarks/results/<name>.{json,md,png}; exit status 0 only when every check held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_common import (
    RESULTS,
    build_tiny_models,
    free_port,
    machine_info,
    machine_line,
    now,
    pyplot,
    write_results,
)
from benchmarks.loadgen import LoadConfig, Sample, percentiles, run_load
from deploy.local.stack import NGINX_CONF, LocalStack, StackConfig

ROOT = Path(__file__).resolve().parents[1]

INFERENCE = '{endpoint=~"/classify|/ner|/multiple-choice|/qa"}'
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "bert-serving.json"


@dataclass
class Timing:
    """Phase lengths in seconds. The defaults are the full benchmark; QUICK is the test suite's."""

    steady_requests: int = 2000
    kill_after_s: float = 10.0
    down_for_s: float = 10.0
    tail_s: float = 10.0  # load continues this long after the last fault event
    max_phase_s: float = 300.0
    scrape_wait_s: float = 20.0


# The tiny bundles have 64-token windows, so a long QA context is dozens of queued items: a deep
# queue keeps shedding (429, not what these runs are about) out of the way, as in test_live_server.
TINY_ENV = {"MAX_QUEUE": "8192"}
QUICK = Timing(steady_requests=300, kill_after_s=1.5, down_for_s=1.5, tail_s=1.5, max_phase_s=60.0)


@dataclass
class Phase:
    name: str
    report: dict[str, Any]
    samples: list[Sample]
    started: float  # perf_counter at the phase's start
    events: list[tuple[float, str]] = field(default_factory=list)  # (s since start, what)

    def event(self, what: str) -> None:
        self.events.append((round(time.perf_counter() - self.started, 3), what))

    def summary(self, retried: int) -> dict[str, Any]:
        fault_window = [t for t, _ in self.events]
        during = [
            s.latency_s
            for s in self.samples
            if self.events and fault_window[0] <= s.sent_at - self.started <= fault_window[-1]
        ]
        return {
            "requests": self.report["requests"],
            "ok": self.report["ok"],
            "errors": self.report["errors"],
            "status_codes": self.report["status_codes"],
            "schema_errors": self.report["schema_errors"],
            "connection_errors": self.report["status_codes"].get("connection_error", 0),
            "timeouts": self.report["status_codes"].get("timeout", 0),
            "retried_by_nginx": retried,
            "elapsed_s": self.report["elapsed_s"],
            "throughput_rps": self.report["throughput_rps"],
            "latency_ms": self.report["latency_ms"],
            "latency_during_faults_ms": percentiles(during),
            "requests_during_faults": len(during),
            "events": [{"t_s": t, "event": what} for t, what in self.events],
            "endpoints": {
                name: {k: ep[k] for k in ("requests", "errors", "latency_ms")}
                for name, ep in self.report["endpoints"].items()
            },
        }

    def timeline(self) -> list[dict[str, Any]]:
        """Per second of the phase (by send time): requests, failures, p50 and p99 ms, for the plot."""
        return bin_timeline(
            [(s.sent_at - self.started, s.latency_s, s.status.startswith("2") and s.schema_error is None)
             for s in self.samples]
        )  # fmt: skip


def bin_timeline(rows: list[tuple[float, float, bool]], width_s: float = 1.0) -> list[dict[str, Any]]:
    """(seconds since the phase started, latency in seconds, ok) -> one summary per `width_s` bin."""
    bins: dict[int, list[tuple[float, bool]]] = {}
    for t, latency, ok in rows:
        bins.setdefault(int(t // width_s), []).append((latency, ok))
    out = []
    for i in sorted(bins):
        stats = percentiles([latency for latency, _ in bins[i]])
        failed = sum(not ok for _, ok in bins[i])
        out.append({"t_s": i * width_s, "requests": len(bins[i]), "failed": failed,
                    "p50_ms": stats["p50"], "p99_ms": stats["p99"]})  # fmt: skip
    return out


async def under_load(
    name: str, config: LoadConfig, faults: Callable[[Phase], Awaitable[None]], tail_s: float
) -> Phase:
    """Run closed-loop load, inject `faults` meanwhile, keep the load on `tail_s` more, then stop it."""
    stop, samples = asyncio.Event(), []
    phase = Phase(name, {}, samples, time.perf_counter())
    load = asyncio.create_task(run_load(config, stop=stop, samples=samples))
    try:
        await faults(phase)
        await asyncio.sleep(tail_s)
    finally:
        stop.set()
        phase.report = await load
    return phase


def kill9(stack: Any, index: int, timing: Timing) -> Callable[[Phase], Awaitable[None]]:
    async def inject(phase: Phase) -> None:
        await asyncio.sleep(timing.kill_after_s)
        stack.signal_replica(index, signal.SIGKILL)
        phase.event(f"kill -9 replica {index}")
        await asyncio.to_thread(stack.wait_replica_exit, index)
        await asyncio.sleep(timing.down_for_s)
        stack.start_replica(index)
        phase.event(f"replica {index} started")
        await asyncio.to_thread(stack.wait_replica_ready, index)
        phase.event(f"replica {index} ready")

    return inject


def rolling_restart(stack: Any, timing: Timing) -> Callable[[Phase], Awaitable[None]]:
    async def inject(phase: Phase) -> None:
        await asyncio.sleep(timing.kill_after_s)
        for index in sorted(stack.replicas):
            stack.signal_replica(index, signal.SIGTERM)
            phase.event(f"SIGTERM replica {index}")
            await asyncio.to_thread(stack.wait_replica_exit, index)
            phase.event(f"replica {index} exited")
            stack.start_replica(index)
            await asyncio.to_thread(stack.wait_replica_ready, index)
            phase.event(f"replica {index} ready")

    return inject


def steady(requests: int) -> Callable[[Phase], Awaitable[None]]:
    async def wait_for_requests(phase: Phase) -> None:
        while len(phase.samples) < requests:  # samples land as responses arrive
            await asyncio.sleep(0.05)

    return wait_for_requests


# ------------------------------------------------------------------------------------------ Prometheus
def prometheus_query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query through Prometheus' HTTP API; raises on an error (a query that fails to parse)."""
    import httpx

    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    if body.get("status") != "success":
        raise ValueError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def scraped_state(stack: Any) -> dict[str, Any]:
    url = stack.prometheus_url
    up = {r["metric"]["instance"]: r["value"][1] == "1" for r in prometheus_query(url, 'up{job="bert-api"}')}
    (total,) = prometheus_query(url, f"sum(bert_requests_total{INFERENCE})") or [{"value": [0, "0"]}]
    by_status = {
        r["metric"].get("status", "?"): int(float(r["value"][1]))
        for r in prometheus_query(url, f"sum by (status) (bert_requests_total{INFERENCE})")
    }
    return {"targets_up": up, "requests_counted": int(float(total["value"][1])), "by_status": by_status}


def wait_for_scrape(stack: Any, expected_requests: int, timeout_s: float) -> dict[str, Any]:
    """Poll Prometheus until every replica is up and the counters reach the clients' count (or timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = scraped_state(stack)
        done = set(state["targets_up"]) == stack.expected_targets() and all(state["targets_up"].values())
        if (done and state["requests_counted"] >= expected_requests) or time.monotonic() > deadline:
            state["expected_requests"] = expected_requests
            state["all_targets_up"] = done
            return state
        time.sleep(0.5)


def evaluate_dashboard(prometheus_url: str, rate_interval: str = "30s") -> dict[str, int]:
    """Every Grafana panel query, evaluated by Prometheus: {expr: number of series returned}."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    results = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", rate_interval)
            results[target["expr"]] = len(prometheus_query(prometheus_url, expr))
    return results


# ------------------------------------------------------------------------------------------ nginx log
class AccessLog:
    """Requests nginx passed to more than one replica (`up=a, b` in the access log) since a mark."""

    def __init__(self, read: Callable[[], str]):
        self.read, self.offset = read, 0

    def mark(self) -> None:
        self.offset = len(self.read())

    def retried(self) -> int:
        return sum(1 for line in self.read()[self.offset :].splitlines() if re.search(r" up=[^ ]+, ", line))


# ------------------------------------------------------------------------------------------ the run
async def run_phases(stack: Any, clients: int, timing: Timing) -> dict[str, Any]:
    def load(seed: int) -> LoadConfig:
        return LoadConfig(
            url=stack.url, concurrency=clients, duration_s=timing.max_phase_s, timeout_s=60.0, seed=seed
        )

    log = AccessLog(stack.nginx_log)
    results: dict[str, Any] = {}
    phases: list[Phase] = []
    for seed, (name, faults) in enumerate(
        [
            ("steady", steady(timing.steady_requests)),
            ("kill9", kill9(stack, sorted(stack.replicas)[1], timing)),
            ("rolling_restart", rolling_restart(stack, timing)),
        ]
    ):
        log.mark()
        phase = await under_load(name, load(seed), faults, 0.0 if name == "steady" else timing.tail_s)
        phases.append(phase)
        results[name] = phase.summary(log.retried())
        if name == "steady":  # counters only add up before any replica restarts
            results[name]["prometheus"] = await asyncio.to_thread(
                wait_for_scrape, stack, phase.report["requests"], timing.scrape_wait_s
            )
    results["prometheus_after_faults"] = await asyncio.to_thread(
        wait_for_scrape, stack, 0, timing.scrape_wait_s
    )
    results["timelines"] = {p.name: p.timeline() for p in phases[1:]}
    return results


def checks(results: dict[str, Any]) -> dict[str, bool]:
    prometheus = results["steady"]["prometheus"]
    return {
        "steady_no_errors": results["steady"]["errors"] == 0,
        "kill9_no_errors": results["kill9"]["errors"] == 0,
        "rolling_restart_no_errors": results["rolling_restart"]["errors"] == 0,
        "prometheus_all_targets_up": prometheus["all_targets_up"],
        "prometheus_counts_every_request": prometheus["requests_counted"] == prometheus["expected_requests"],
        "prometheus_targets_up_after_faults": results["prometheus_after_faults"]["all_targets_up"],
    }


def local_stack(models_dir: Path, run_dir: Path, nginx_conf: Path = NGINX_CONF, **env: str) -> LocalStack:
    """The compose topology as host processes (deploy/local/stack.py)."""
    config = StackConfig(
        nginx_conf=nginx_conf,
        models_dir=models_dir,
        run_dir=run_dir,
        replica_ports=[free_port() for _ in range(3)],
        http_port=free_port(),
        prometheus_port=free_port(),
        env=env,
    )
    return LocalStack(config)


def run_stack(stack: Any, clients: int, timing: Timing) -> dict[str, Any]:
    """Start `stack` (a LocalStack or deploy/podman/stack.py's ComposeStack), fault it under load, stop it."""
    started = time.monotonic()
    stack.start()
    startup_s = time.monotonic() - started
    try:
        results = asyncio.run(run_phases(stack, clients, timing))
        results["dashboard_series"] = evaluate_dashboard(stack.prometheus_url)
    finally:
        stack.stop()
    results["startup_s"] = round(startup_s, 1)
    results["checks"] = checks(results)
    return results


# ------------------------------------------------------------------------------------------ output
def markdown(report: dict[str, Any]) -> str:
    r = report["results"]
    lines = [
        f"# Faults under load through nginx ({report['replicas']} replicas, {report['clients']} clients)",
        "",
        f"`{report['command']}` on {report['date']}. Models: `{report['models']}`; "
        f"{report['nginx_conf']}"
        + (f"; replica settings {report['replica_env']}" if report["replica_env"] else "")
        + f". {report['machine_line']}",
        "",
        (
            "`deploy/docker-compose.yml` itself as podman containers (`deploy/podman/stack.py`: the built "
            "image's replicas on a read-only root, nginx and Prometheus; kill -9 is `podman kill -s KILL`, "
            "the roll `podman stop` then `podman start`)"
            if report.get("stack", "").startswith("deploy/docker-compose.yml")
            else "The local compose topology (`deploy/local/stack.py`: nginx with `deploy/nginx/nginx.conf`, "
            "Prometheus with `deploy/prometheus/prometheus.yml`, replicas with the compose environment)"
        )
        + " under closed-loop load of the loadgen mix (classify, NER, multiple choice, QA). Errors count "
        "every non-2xx answer, schema violation, connection error and timeout the clients saw.",
        "",
        "| phase | requests | errors | connection errors | retried by nginx | p50 ms | p99 ms "
        "| p99 ms during the fault | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("steady", "kill9", "rolling_restart"):
        p = r[name]
        lat, during = p["latency_ms"], p["latency_during_faults_ms"]
        lines.append(
            f"| {name} | {p['requests']} | {p['errors']} | {p['connection_errors']} "
            f"| {p['retried_by_nginx']} | {lat['p50']} | {lat['p99']} | {during['p99'] or '-'} "
            f"| {lat['max']} |"
        )
    endpoints = list(r["steady"]["endpoints"])
    lines += [
        "",
        "p50 / p99 latency in ms per endpoint:",
        "",
        "| phase | " + " | ".join(f"/{e}" for e in endpoints) + " |",
        "|---|" + "---:|" * len(endpoints),
    ]
    for name in ("steady", "kill9", "rolling_restart"):
        cells = [r[name]["endpoints"][e]["latency_ms"] for e in endpoints]
        lines.append(f"| {name} | " + " | ".join(f"{c['p50']} / {c['p99']}" for c in cells) + " |")
    prometheus = r["steady"]["prometheus"]
    lines += [
        "",
        "Events (seconds from the phase's start):",
        "",
        *[
            f"- {name}: " + "; ".join(f"{e['t_s']} s {e['event']}" for e in r[name]["events"])
            for name in ("kill9", "rolling_restart")
        ],
        "",
        f"Prometheus after the steady phase: targets up {prometheus['targets_up']}; inference requests "
        f"counted by the replicas {prometheus['requests_counted']} against {prometheus['expected_requests']} "
        f"sent by the clients (by status {prometheus['by_status']}). After the faults every target is up "
        f"again: {r['prometheus_after_faults']['all_targets_up']}. Every Grafana panel query evaluated: "
        f"{sum(1 for n in r['dashboard_series'].values() if n)} of {len(r['dashboard_series'])} returned "
        "series (the others select errors or rejections, of which there were none).",
        "",
        "Checks: " + ", ".join(f"{k} {'✓' if v else '✗'}" for k, v in r["checks"].items()),
    ]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    timelines = report["results"]["timelines"]
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 3.6 * len(timelines)), squeeze=False)
    for ax, (name, bins) in zip(axes[:, 0], timelines.items(), strict=True):
        t = [b["t_s"] for b in bins]
        ax.plot(t, [b["p50_ms"] for b in bins], label="p50 per second")
        ax.plot(t, [b["p99_ms"] for b in bins], label="p99 per second")
        failed = [(b["t_s"], b["p99_ms"]) for b in bins if b["failed"]]
        if failed:
            ax.scatter(*zip(*failed, strict=True), s=24, c="red", marker="x", label="a second with failures")
        for i, event in enumerate(report["results"][name]["events"]):
            ax.axvline(event["t_s"], color="grey", linestyle="--", linewidth=0.8)
            height = 0.98 if i % 2 == 0 else 0.45  # staggered: events often come in pairs
            ax.annotate(event["event"], (event["t_s"], height), xycoords=("data", "axes fraction"),
                        rotation=90, va="top", ha="right", fontsize=7)  # fmt: skip
        summary = report["results"][name]
        ax.set_title(
            f"{name}: {summary['requests']} requests, {summary['errors']} errors, "
            f"p99 {summary['latency_ms']['p99']} ms"
        )
        ax.set_yscale("log")
        ax.set_xlabel("seconds since the phase started (request sent)")
        ax.set_ylabel("latency, ms")
        ax.legend(loc="lower right", fontsize=7, markerscale=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "bundles")
    p.add_argument("--tiny", action="store_true", help="the test suite's tiny random bundles (plumbing only)")
    p.add_argument("--quick", action="store_true", help="short phases (the test suite's timing)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument(
        "--stack",
        choices=["local", "compose"],
        default="local",
        help="local: host processes (deploy/local/stack.py); compose: deploy/docker-compose.yml as "
        "containers with podman-compose (deploy/podman/stack.py), on the built image and its own bundles",
    )
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="a replica setting")
    p.add_argument(
        "--nginx-conf-rev",
        metavar="REV",
        help="use deploy/nginx/nginx.conf as of this git revision (to compare with an older one)",
    )
    p.add_argument("--name", default="faults")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models_dir, env = args.models_dir, {}
    if args.tiny:
        models_dir = build_tiny_models()
        env = dict(TINY_ENV)
    env |= dict(item.split("=", 1) for item in args.env)
    if args.stack == "local" and not list(models_dir.glob("*/bundle.json")):
        raise SystemExit(f"no bundles in {models_dir}: run `make models` (or pass --tiny)")
    timing = QUICK if args.quick else Timing()
    machine = machine_info()
    if args.stack == "compose":
        from deploy.podman.stack import ComposeStack

        results = run_stack(
            ComposeStack(http_port=free_port(), prometheus_port=free_port()), args.clients, timing
        )
    else:
        with tempfile.TemporaryDirectory(prefix="faults-") as run_dir:
            nginx_conf = NGINX_CONF
            if args.nginx_conf_rev:
                nginx_conf = Path(run_dir) / "nginx.source.conf"
                show = ["git", "show", f"{args.nginx_conf_rev}:deploy/nginx/nginx.conf"]
                nginx_conf.write_text(
                    subprocess.run(show, cwd=ROOT, check=True, capture_output=True, text=True).stdout
                )
            stack = local_stack(models_dir, Path(run_dir) / "stack", nginx_conf, **env)
            results = run_stack(stack, args.clients, timing)
    command = " ".join(["python -m benchmarks.faults", *(argv if argv is not None else sys.argv[1:])])
    report = {
        "command": command.strip(),
        "date": now(),
        "stack": "deploy/docker-compose.yml as containers (podman-compose)"
        if args.stack == "compose"
        else "host processes (deploy/local/stack.py)",
        "models": "tiny test bundles"
        if args.tiny
        else "the image's five defaults"
        if args.stack == "compose"
        else ", ".join(sorted(p.parent.name for p in models_dir.glob("*/bundle.json"))),
        "nginx_conf": f"deploy/nginx/nginx.conf as of {args.nginx_conf_rev or 'this commit'}",
        "replicas": 3,
        "clients": args.clients,
        "replica_env": env,
        "timing": timing.__dict__,
        "machine": machine,
        "machine_line": machine_line(machine),
        "results": results,
        "passed": all(results["checks"].values()),
    }
    write_results(args.out, args.name, report, markdown(report), lambda path: plot(report, path))
    print(markdown(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
