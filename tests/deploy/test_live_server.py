"""The real server, started through deploy/entrypoint.sh on loopback, under load from benchmarks/loadgen.py.

A constant-rate run (~5 s) across all four endpoints must give zero errors and schema-valid answers;
/metrics must then show every series the Grafana dashboard and the alert rules query; SIGTERM must stop it
cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks.loadgen_payloads import ENDPOINTS
from tests.deploy.files import (
    DASHBOARD,
    DEPLOY,
    ENTRYPOINT,
    PROMETHEUS_BUILTINS,
    ROOT,
    load_yaml,
    promql_metric_names,
    series_names,
)
from tests.reliability.live import free_port

RATE, DURATION_S = 16, 5


@pytest.fixture
def server(models_dir, tmp_path):  # models_dir: the session's tiny bundles (tests/conftest.py)
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MODELS_DIR": str(models_dir),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "WORKERS": "1",
        "LOG_LEVEL": "info",
        "DEVICE": "cpu",
        "MAX_WAIT_MS": "5",
        # The queue counts work items (QA windows); with 64-token tiny bundles a few long contexts
        # hold hundreds. Shedding load is not what this test is about, so keep it out of the way.
        "MAX_QUEUE": "8192",
    }
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(["bash", str(ENTRYPOINT)], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, process, log_path
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def scraped_series(url: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
    return series_names({family.name: family.type for family in families})


@pytest.mark.slow
def test_constant_rate_load_across_all_endpoints(server, tmp_path):
    url, process, log_path = server
    out = tmp_path / "load.json"
    command = [
        sys.executable, "-m", "benchmarks.loadgen", "--url", url, "--rate", str(RATE),
        "--duration", str(DURATION_S), "--concurrency", "64", "--wait-ready", "120", "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert process.poll() is None, log_path.read_text()
    assert result.returncode == 0, result.stdout + result.stderr + log_path.read_text()

    report = json.loads(out.read_text())
    assert report["requests"] == RATE * DURATION_S
    assert report["errors"] == report["schema_errors"] == report["dropped"] == 0, report
    assert report["status_codes"] == {"200": report["requests"]}
    for endpoint in ENDPOINTS:
        stats = report["endpoints"][endpoint]
        assert stats["requests"] > 0 and stats["ok"] == stats["requests"], (endpoint, stats)
    assert report["latency_ms"]["p99"] is not None

    # The request id survives the round trip (nginx passes it; the app must echo it).
    response = httpx.post(
        f"{url}/classify", json={"text": "a good film"}, headers={"X-Request-ID": "trace-42"}
    )
    assert response.status_code == 200 and response.headers["x-request-id"] == "trace-42"

    # Every series the dashboard and the alert rules query is really exposed, now that traffic has
    # gone through.
    exposed = scraped_series(url)
    dashboard = json.loads(DASHBOARD.read_text())
    queries = {panel["title"]: target["expr"] for panel in dashboard["panels"] for target in panel["targets"]}
    for group in load_yaml(DEPLOY / "prometheus" / "alerts.yml")["groups"]:
        queries |= {rule["alert"]: rule["expr"] for rule in group["rules"]}
    for name, expr in queries.items():
        missing = promql_metric_names(expr) - exposed - PROMETHEUS_BUILTINS
        assert not missing, f"{name}: {missing} not in /metrics"

    # Graceful stop: uvicorn drains, the app shuts down, then uvicorn re-raises the signal.
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    log = log_path.read_text()
    assert "shutdown complete" in log and "Traceback" not in log, log
