"""The Grafana dashboard: valid JSON, the agreed panels, and only metric names the app exposes (the
alert rules too)."""

from __future__ import annotations

import json
import re

import pytest

from tests.deploy.files import (
    AGREED_METRICS,
    DASHBOARD,
    DEPLOY,
    PROMETHEUS_BUILTINS,
    app_metric_families,
    load_yaml,
    promql_metric_names,
    series_names,
)


def exposed_series() -> set[str]:
    """Series the app exposes: from app/observe/metrics.py, or the agreed list if the app is not there."""
    return series_names(app_metric_families() or AGREED_METRICS)


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_promql_metric_names():
    expr = 'sum by (endpoint, le) (rate(bert_x_bucket{status!~"2..", a="b"}[5m])) / clamp_min(up, 1e-9) * 2'
    assert promql_metric_names(expr) == {"bert_x_bucket", "up"}
    assert promql_metric_names(
        "histogram_quantile(0.99, sum without (pod) (rate(y_bucket[$__rate_interval])))"
    ) == {"y_bucket"}


def test_series_names():
    families = {"a_total": "counter", "b": "counter", "h": "histogram", "g": "gauge"}
    assert series_names(families) == {"a_total", "b_total", "h_bucket", "h_sum", "h_count", "g"}


def test_app_exposes_the_agreed_metrics():
    families = app_metric_families()
    if families is None:
        pytest.skip("app.metrics does not import yet")
    assert series_names(AGREED_METRICS) <= series_names(families)


def test_dashboard_shape(dashboard):
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    (datasource,) = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")[
        "datasources"
    ]
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel["targets"], panel["title"]
        for target in [panel, *panel["targets"]]:
            assert target["datasource"]["uid"] == datasource["uid"], panel["title"]


def test_queries_use_only_exposed_metrics(dashboard):
    exposed = exposed_series() | PROMETHEUS_BUILTINS
    for expr in exprs(dashboard):
        names = promql_metric_names(expr)
        assert names, expr
        assert names <= exposed, f"{expr}: {names - exposed} are not metrics the app exposes"


def test_alert_rules_use_only_exposed_metrics():
    exposed = exposed_series() | PROMETHEUS_BUILTINS
    for group in load_yaml(DEPLOY / "prometheus" / "alerts.yml")["groups"]:
        for rule in group["rules"]:
            names = promql_metric_names(rule["expr"])
            assert names and names <= exposed, (
                f"{rule['alert']}: {names - exposed} are not metrics the app exposes"
            )


def test_required_panels(dashboard):
    queries = exprs(dashboard)
    used = {n for q in queries for n in promql_metric_names(q)}
    for family, kind in AGREED_METRICS.items():
        assert used & series_names({family: kind}), f"no panel uses {family}"
    latency = [q for q in queries if "bert_request_latency_seconds_bucket" in q]
    quantiles = {re.search(r"histogram_quantile\(([\d.]+)", q).group(1) for q in latency}
    assert quantiles >= {"0.5", "0.95", "0.99"}
    assert all(re.search(r"by \(endpoint, le\)", q) for q in latency), "latency per endpoint"
    assert any("bert_requests_total" in q and "by (endpoint)" in q for q in queries), "request rate"
    assert any("bert_requests_total" in q and re.search(r"by \(status\b", q) for q in queries), "errors"
    assert any("bert_batch_size" in q and "by (task)" in q for q in queries), "batch sizes"
    assert any("bert_queue_depth" in q and "by (task)" in q for q in queries), "queue depth"
