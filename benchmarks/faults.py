"""Faults injected into the running deployment under load: kill -9 of a replica, a rolling restart,
and Prometheus' view of it all (deploy/README.md, "Faults under load"); exit 0 only when every check held.

    .venv/bin/python -m benchmarks.faults                          # default bundles, 3 replicas, 32 clients
    .venv/bin/python -m benchmarks.faults --tiny --quick --name faults_smoke   # test-size models, short
    .venv/bin/python -m benchmarks.faults --stack compose          # deploy/docker-compose.yml as containers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks import reliability as rel
from benchmarks.loadgen import LoadConfig, run_load
from deploy.local.stack import NGINX_CONF, LocalStack, StackConfig

ROOT = Path(__file__).resolve().parents[1]
INFERENCE = '{endpoint=~"/classify|/ner|/multiple-choice|/qa"}'
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "bert-serving.json"
PHASES = ("steady", "kill9", "rolling_restart")


@dataclass
class Timing:  # seconds; the defaults are the full benchmark, QUICK the test suite's
    steady_requests: int = 2000
    kill_after_s: float = 10.0
    down_for_s: float = 10.0
    tail_s: float = 10.0  # load continues this long after the last fault event
    max_phase_s: float = 300.0
    scrape_wait_s: float = 20.0


# The tiny bundles have 64-token windows, so a long QA context is dozens of queued items: a deep
# queue and no queueing deadline keep shedding (429 / 503, not what these runs are about) out of
# the way, as in test_live_server. A CI run once shed 2 requests by cost (MAX_QUEUE_MS) while two
# replicas carried 32 clients on a CPU shared with the rest of the suite.
TINY_ENV = {"MAX_QUEUE": "8192", "MAX_QUEUE_MS": "0"}
QUICK = Timing(steady_requests=300, kill_after_s=1.5, down_for_s=1.5, tail_s=1.5, max_phase_s=60.0)


def scenarios(stack: Any, timing: Timing) -> dict[str, Any]:
    """Each phase's faults, as a coroutine on its Run."""

    async def steady(run: rel.Run) -> None:
        while len(run.samples) < timing.steady_requests:  # samples land as responses arrive
            await asyncio.sleep(0.05)

    async def restart(run: rel.Run, index: int, sig: signal.Signals, what: str) -> None:
        stack.signal_replica(index, sig)
        run.event(f"{what} replica {index}")
        await asyncio.to_thread(stack.wait_replica_exit, index)
        if sig == signal.SIGKILL:
            await asyncio.sleep(timing.down_for_s)  # compose's restart policy takes a while
            stack.start_replica(index)
            run.event(f"replica {index} started")
        else:
            run.event(f"replica {index} exited")
            stack.start_replica(index)
        await asyncio.to_thread(stack.wait_replica_ready, index)
        run.event(f"replica {index} ready")

    async def kill9(run: rel.Run) -> None:
        await asyncio.sleep(timing.kill_after_s)
        await restart(run, sorted(stack.replicas)[1], signal.SIGKILL, "kill -9")

    async def rolling_restart(run: rel.Run) -> None:
        await asyncio.sleep(timing.kill_after_s)
        for index in sorted(stack.replicas):
            await restart(run, index, signal.SIGTERM, "SIGTERM")

    return {"steady": steady, "kill9": kill9, "rolling_restart": rolling_restart}


def summary(run: rel.Run, report: dict[str, Any], retried: int) -> dict[str, Any]:
    """loadgen's report of the phase (less its config), with the faults' events and what happened then."""
    during = run.latency_within([(run.events[0]["t_s"], run.events[-1]["t_s"])] if run.events else [])
    return {k: v for k, v in report.items() if k != "config"} | {
        "connection_errors": report["status_codes"].get("connection_error", 0),
        "retried_by_nginx": retried,
        "latency_during_faults_ms": during,
        "requests_during_faults": during["requests"],
        "events": run.events,
    }


def prometheus_query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query through Prometheus' HTTP API; raises on an error (a query that fails to parse)."""
    import httpx

    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    if body.get("status") != "success":
        raise ValueError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def wait_for_scrape(stack: Any, expected_requests: int, timeout_s: float) -> dict[str, Any]:
    """Poll Prometheus until every replica is up and the counters reach the clients' count (or timeout)."""
    url, deadline = stack.prometheus_url, time.monotonic() + timeout_s
    while True:
        targets = prometheus_query(url, 'up{job="bert-api"}')
        up = {r["metric"]["instance"]: r["value"][1] == "1" for r in targets}
        by_status = {
            r["metric"].get("status", "?"): int(float(r["value"][1]))
            for r in prometheus_query(url, f"sum by (status) (bert_requests_total{INFERENCE})")
        }
        done = set(up) == stack.expected_targets() and all(up.values())
        if (done and sum(by_status.values()) >= expected_requests) or time.monotonic() > deadline:
            return {"targets_up": up, "requests_counted": sum(by_status.values()), "by_status": by_status,
                    "expected_requests": expected_requests, "all_targets_up": done}  # fmt: skip
        time.sleep(0.5)


def evaluate_dashboard(prometheus_url: str, rate_interval: str = "30s") -> dict[str, int]:
    """Every Grafana panel query, evaluated by Prometheus: {expr: number of series returned}."""
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    return {
        t["expr"]: len(prometheus_query(prometheus_url, t["expr"].replace("$__rate_interval", rate_interval)))
        for panel in panels
        for t in panel["targets"]
    }


async def run_phases(stack: Any, clients: int, timing: Timing) -> dict[str, Any]:
    results: dict[str, Any] = {"timelines": {}}
    for seed, (name, faults) in enumerate(scenarios(stack, timing).items()):
        log_offset = len(stack.nginx_log())
        config = LoadConfig(stack.url, None, timing.max_phase_s, concurrency=clients, timeout_s=60, seed=seed)
        run = rel.Run(name)

        def load(stop: asyncio.Event, config=config, run=run) -> Any:
            return run_load(config, stop=stop, samples=run.samples)

        report = await rel.under_load(run, load, faults, 0.0 if name == "steady" else timing.tail_s)
        run.rows = [(s.sent_at - run.started, s.latency_s, s.status[0] == "2" and not s.schema_error, None)
                    for s in run.samples]  # fmt: skip
        # nginx passed a request to more than one replica: `up=a, b` in its access log
        retried = len(re.findall(r" up=[^ \n]+, ", stack.nginx_log()[log_offset:]))
        results[name] = summary(run, report, retried)
        if name == "steady":  # counters only add up before any replica restarts
            scrape = await asyncio.to_thread(wait_for_scrape, stack, report["requests"], timing.scrape_wait_s)
            results[name]["prometheus"] = scrape
        else:
            results["timelines"][name] = run.timeline()
    after = await asyncio.to_thread(wait_for_scrape, stack, 0, timing.scrape_wait_s)
    results["prometheus_after_faults"] = after
    return results


def checks(results: dict[str, Any]) -> dict[str, bool]:
    prometheus = results["steady"]["prometheus"]
    return {
        **{f"{name}_no_errors": results[name]["errors"] == 0 for name in PHASES},
        "prometheus_all_targets_up": prometheus["all_targets_up"],
        "prometheus_counts_every_request": prometheus["requests_counted"] == prometheus["expected_requests"],
        "prometheus_targets_up_after_faults": results["prometheus_after_faults"]["all_targets_up"],
    }


def local_stack(models_dir: Path, run_dir: Path, nginx_conf: Path = NGINX_CONF, **env: str) -> LocalStack:
    """The compose topology as host processes (deploy/local/stack.py)."""
    port = common.free_port
    return LocalStack(StackConfig(nginx_conf=nginx_conf, models_dir=models_dir, run_dir=run_dir, env=env,
                                  replica_ports=[port() for _ in range(3)], http_port=port(),
                                  prometheus_port=port()))  # fmt: skip


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
    return {**results, "startup_s": round(startup_s, 1), "checks": checks(results)}


def markdown(report: dict[str, Any]) -> str:
    r, series = report["results"], report["results"]["dashboard_series"]
    endpoints, prometheus = list(r["steady"]["endpoints"]), r["steady"]["prometheus"]
    body = [
        f"The compose topology as {report['stack']}: {report['replicas']} replicas (models "
        f"`{report['models']}`, settings {report['replica_env'] or 'the defaults'}), nginx with "
        f"`deploy/nginx/nginx.conf`, Prometheus; {report['clients']} closed-loop clients on the loadgen mix "
        "(classify, NER, multiple choice, QA). Errors count every non-2xx answer, schema violation, "
        "connection error and timeout the clients saw.",
        "",
        "| phase | requests | errors | connection errors | retried by nginx | p50 ms | p99 ms "
        "| p99 ms during the fault | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {n} | {p['requests']} | {p['errors']} | {p['connection_errors']} | {p['retried_by_nginx']} "
          f"| {p['latency_ms']['p50']} | {p['latency_ms']['p99']} "
          f"| {p['latency_during_faults_ms']['p99'] or '-'} | {p['latency_ms']['max']} |"
          for n, p in ((n, r[n]) for n in PHASES)),
        "",
        "p50 / p99 latency in ms per endpoint:",
        "",
        "| phase | " + " | ".join(f"/{e}" for e in endpoints) + " |",
        "|---|" + "---:|" * len(endpoints),
        *(f"| {n} | " + " | ".join(f"{c['p50']} / {c['p99']}" for c in (r[n]["endpoints"][e]["latency_ms"]
          for e in endpoints)) + " |" for n in PHASES),
        "",
        "Events (seconds from the phase's start):",
        "",
        *(f"- {n}: " + "; ".join(f"{e['t_s']} s {e['event']}" for e in r[n]["events"]) for n in PHASES[1:]),
        "",
        f"Prometheus after the steady phase: targets up {prometheus['targets_up']}; inference requests "
        f"counted by the replicas {prometheus['requests_counted']} against {prometheus['expected_requests']} "
        f"sent by the clients (by status {prometheus['by_status']}). After the faults every target is up "
        f"again: {r['prometheus_after_faults']['all_targets_up']}. Every Grafana panel query evaluated: "
        f"{sum(1 for n in series.values() if n)} of {len(series)} returned series (the others select errors "
        "or rejections, of which there were none).",
    ]  # fmt: skip
    return rel.markdown("Faults under load through nginx", {**report, "checks": r["checks"]}, body)


def plot(report: dict[str, Any], path: Path) -> None:
    timelines = report["results"]["timelines"]
    fig, axes = common.pyplot().subplots(len(timelines), 1, figsize=(11, 3.6 * len(timelines)), squeeze=False)
    for ax, (name, bins) in zip(axes[:, 0], timelines.items(), strict=True):
        s = report["results"][name]
        title = f"{name}: {s['requests']} requests, {s['errors']} errors, p99 {s['latency_ms']['p99']} ms"
        rel.plot_timeline(ax, bins, s["events"], title)
    common.save_figure(fig, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "bundles")
    p.add_argument("--tiny", action="store_true", help="the test suite's tiny random bundles (plumbing only)")
    p.add_argument("--quick", action="store_true", help="short phases (the test suite's timing)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--stack", choices=["local", "compose"], default="local",
                   help="local: host processes (deploy/local/stack.py); compose: deploy/docker-compose.yml "
                   "as containers (deploy/podman/stack.py), on the built image and its bundles")  # fmt: skip
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="a replica setting")
    p.add_argument("--name", default="faults")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models_dir, env = (common.build_tiny_models(), dict(TINY_ENV)) if args.tiny else (args.models_dir, {})
    env |= dict(item.split("=", 1) for item in args.env)
    if args.stack == "local" and not list(models_dir.glob("*/bundle.json")):
        raise SystemExit(f"no bundles in {models_dir}: run `make models` (or pass --tiny)")
    timing, machine = QUICK if args.quick else Timing(), common.machine_info()
    if args.stack == "compose":
        from deploy.podman.stack import ComposeStack

        compose = ComposeStack(http_port=common.free_port(), prometheus_port=common.free_port())
        results = run_stack(compose, args.clients, timing)
        stack, models = "`deploy/docker-compose.yml` run by podman (`deploy/podman/stack.py`)", "the image's"
    else:
        with tempfile.TemporaryDirectory(prefix="faults-") as run_dir:
            results = run_stack(local_stack(models_dir, Path(run_dir) / "stack", **env), args.clients, timing)
        stack = "host processes (`deploy/local/stack.py`)"
        models = ", ".join(sorted(p.parent.name for p in models_dir.glob("*/bundle.json")))
    report = {
        "command": common.command("faults", argv),
        "date": common.now(),
        "stack": stack,
        "models": "tiny test bundles" if args.tiny else models,
        "replicas": 3,
        "clients": args.clients,
        "replica_env": env,
        "timing": timing.__dict__,
        "machine": machine,
        "results": results,
        "checks": results["checks"],
    }
    return rel.finish(args.out, args.name, report, markdown(report), lambda path: plot(report, path))


if __name__ == "__main__":
    sys.exit(main())
