"""The compose topology run for real (deploy/local/stack.py): 3 replicas on the tiny bundles, nginx with
deploy/nginx/nginx.conf and Prometheus with deploy/prometheus/prometheus.yml, rendered for loopback.

With 32 clients sending the loadgen mix through nginx: no request may fail when a replica is killed
with SIGKILL, nor during a rolling restart (benchmarks/faults.py, short timing); Prometheus must see
every replica up and count exactly the requests the clients sent; every Grafana panel query must
evaluate in it. The full-size run on the default models is benchmarks/results/faults.md.
Skipped without nginx or Prometheus (apt-get install nginx prometheus).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from dataclasses import replace

import pytest

from benchmarks.faults import QUICK, TINY_ENV, local_stack, run_stack
from deploy.local.stack import NGINX_CONF, LocalStack, StackConfig, down, find_tool, render_nginx

PORTS = [18001, 18002, 18003]
# The faults' windows are the replicas' restarts (seconds under this load), not the pauses around
# them, and 100 steady requests reach every endpoint and dashboard panel as 300 do: every check
# holds while the closed loop, which keeps both cores busy, runs half as long as with QUICK.
TIMING = replace(QUICK, steady_requests=100, kill_after_s=0.3, down_for_s=0.3, tail_s=0.3)


def test_nginx_rendering_changes_only_what_docker_provides(tmp_path):
    source = NGINX_CONF.read_text()
    rendered = render_nginx(source, PORTS, 18080, tmp_path)
    servers = re.findall(r"^\s*server 127\.0\.0\.1:(\d+) ([^;]*);", rendered, re.M)
    assert [int(p) for p, _ in servers] == PORTS * 2  # the replicas, then the same ones as backups
    assert {params for _, params in servers[3:]} == {"backup max_fails=0"}
    assert "resolve" not in re.sub(r"#[^\n]*", "", rendered) and "api-replicas" not in rendered
    assert "listen 127.0.0.1:18080;" in rendered and f"pid {tmp_path.resolve()}/nginx.pid;" in rendered
    # Everything else is the compose file's configuration, line for line.
    kept = [line for line in source.splitlines() if not re.search(r"resolve|listen 80|^pid|_log /dev/", line)]
    assert all(line in rendered.splitlines() for line in kept)


def test_a_drifted_nginx_config_fails_to_render(tmp_path):
    with pytest.raises(ValueError, match="listen 80"):
        render_nginx(NGINX_CONF.read_text().replace("listen 80;", "listen 8081;"), PORTS, 18080, tmp_path)


def test_down_stops_only_the_processes_it_started(tmp_path):
    (tmp_path / "pids").mkdir()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen([*sleeper, "uvicorn"])  # what a replica's command line holds
    stranger = subprocess.Popen(sleeper)  # a pid recycled by another program since `up`
    (tmp_path / "pids" / "replica-0.pid").write_text(f"{ours.pid}\n")
    (tmp_path / "pids" / "replica-1.pid").write_text(f"{stranger.pid}\n")
    try:
        assert down(tmp_path, timeout_s=10) == [f"replica-0 ({ours.pid})"]
        assert ours.wait(timeout=10) == -signal.SIGTERM
        assert stranger.poll() is None
        assert not list((tmp_path / "pids").iterdir())
    finally:
        for process in (ours, stranger):
            process.kill()
            process.wait()


@pytest.mark.skipif(find_tool("nginx") is None, reason="nginx not installed (apt-get install nginx)")
def test_rendered_nginx_config_passes_nginx_t(models_dir, tmp_path):
    stack = LocalStack(StackConfig(models_dir=models_dir, run_dir=tmp_path, prometheus_port=None))
    stack.write_configs()
    result = subprocess.run(stack.nginx_command("-t"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    find_tool("nginx") is None or find_tool("prometheus") is None,
    reason="nginx and prometheus not both installed (apt-get install nginx prometheus)",
)
def test_no_request_fails_through_kill_9_and_a_rolling_restart(models_dir, tmp_path):
    results = run_stack(local_stack(models_dir, tmp_path, **TINY_ENV), 32, TIMING)
    for phase in ("steady", "kill9", "rolling_restart"):
        summary = results[phase]
        brief = {k: summary[k] for k in ("requests", "ok", "errors", "status_codes", "events")}
        assert summary["errors"] == 0 and summary["ok"] == summary["requests"] > 0, (phase, brief)
    # The faults really hit traffic: requests were sent while a replica was down, and nginx had to
    # send some of them to another replica.
    for phase in ("kill9", "rolling_restart"):
        assert results[phase]["requests_during_faults"] > 0 and results[phase]["retried_by_nginx"] > 0, phase
    assert len([e for e in results["rolling_restart"]["events"] if e["event"].endswith("ready")]) == 3

    prometheus = results["steady"]["prometheus"]
    assert prometheus["all_targets_up"] and len(prometheus["targets_up"]) == 3, prometheus
    assert prometheus["requests_counted"] == prometheus["expected_requests"] == results["steady"]["requests"]
    assert prometheus["by_status"] == {"200": results["steady"]["requests"]}
    assert results["prometheus_after_faults"]["all_targets_up"]
    # Every panel query evaluates; all but those selecting errors, rejections and refusals (none here)
    # have data.
    for expr, series in results["dashboard_series"].items():
        empty_here = ("bert_rejected_total", "bert_connections_refused_total", 'status!~"2.."')
        may_be_empty = any(name in expr for name in empty_here)
        assert series > 0 or may_be_empty, expr
