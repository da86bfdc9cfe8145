"""Prometheus' own checker on the deployment's files: the scrape configuration (as compose mounts it
and as deploy/local/stack.py renders it), the alert rules and their unit tests, and every Grafana
panel query parsed as PromQL. promtool tests skip when it is not installed (apt-get install
prometheus). test_grafana.py checks the rules use only metrics the app exports."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.local.stack import find_tool, render_prometheus
from tests.deploy.files import DASHBOARD, DEPLOY, load_yaml

PROMETHEUS = DEPLOY / "prometheus"
promtool_path = find_tool("promtool")
needs_promtool = pytest.mark.skipif(
    promtool_path is None, reason="promtool not installed (apt-get install prometheus)"
)


def promtool(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess:
    assert promtool_path is not None
    return subprocess.run([promtool_path, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def alert_rules() -> list[dict]:
    return [rule for group in load_yaml(PROMETHEUS / "alerts.yml")["groups"] for rule in group["rules"]]


def test_every_rule_file_is_mounted_and_loaded():
    config = load_yaml(PROMETHEUS / "prometheus.yml")
    assert config["rule_files"] == ["alerts.yml"]
    compose = load_yaml(DEPLOY / "docker-compose.yml")
    assert (
        "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro"
        in compose["services"]["prometheus"]["volumes"]
    )


@needs_promtool
def test_promtool_checks_the_compose_config():
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout


@needs_promtool
def test_promtool_checks_the_locally_rendered_config(tmp_path):
    rendered = render_prometheus(load_yaml(PROMETHEUS / "prometheus.yml"), [18001, 18002, 18003], 19090)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(rendered))
    result = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_checks_and_unit_tests_the_alert_rules():
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(alert_rules())} rules found" in result.stdout
    result = promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_every_dashboard_query_parses(tmp_path):
    """Each panel's PromQL as a recording rule, so promtool parses it without a server
    ($__rate_interval is Grafana's; the live stack test evaluates them in a real Prometheus)."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = [
        {"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "1m")}
        for i, e in enumerate(exprs)
    ]
    (tmp_path / "dashboard.rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    result = promtool("check", "rules", str(tmp_path / "dashboard.rules.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout
    # And promtool does reject a broken query, so this check can fail.
    broken = {
        "groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum(rate(bert_requests_total[1m])"}]}]
    }
    (tmp_path / "broken.rules.yml").write_text(yaml.safe_dump(broken))
    assert promtool("check", "rules", str(tmp_path / "broken.rules.yml")).returncode != 0
