"""Prometheus metrics. The names are a contract: the Grafana dashboard queries exactly these."""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
REQUEST_TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)


class Metrics:
    """One registry per app, so several apps (tests) never collide in the global registry.

    `model` is the name of the model that served the request ("" before one is chosen): its values
    are the model directories an operator put in MODELS_DIR, never what a client sent.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # prometheus_client appends `_total` to counters: these expose bert_requests_total and
        # bert_rejected_total.
        self.requests = Counter("bert_requests", "HTTP requests", ["endpoint", "status", "model"], registry=r)
        self.latency = Histogram(
            "bert_request_latency_seconds",
            "HTTP request latency",
            ["endpoint", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "bert_stage_seconds",
            "Time per request stage",
            ["stage", "task", "model"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        # TEI's te_request_input_length: the request's size, beside its stage times (x-compute-tokens).
        self.request_tokens = Histogram(
            "bert_request_tokens",
            "Tokens of a request's work items",
            ["task", "model"],
            buckets=REQUEST_TOKEN_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "bert_batch_size",
            "Work items per inference batch",
            ["task", "model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "bert_batch_padded_tokens",
            "Padded tokens (longest x rows) per batch",
            ["task", "model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        # Gauges say how several processes' values add up (API_SERVERS > 1: app/serve.py).
        self.queue_depth = Gauge(
            "bert_queue_depth",
            "Work items waiting for a batch",
            ["task", "model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.rejected = Counter(
            "bert_rejected", "Work refused or dropped", ["task", "reason", "model"], registry=r
        )
        # Answered by the connection layer before any ASGI request (app/api/connections.py): 401,
        # 408, 431, 503; `evicted` is an idle or header-only connection closed for a new one.
        self.connections_refused = Counter(
            "bert_connections_refused",
            "Connections answered and closed below the app",
            ["reason"],
            registry=r,
        )
        self.model_ready = Gauge(
            "bert_model_ready",
            "1 while a verified version of the model serves",
            ["task", "model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.model_memory = Gauge(
            "bert_model_memory_bytes",
            "Resident memory the serving version took to load",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.model_loads = Counter(
            "bert_model_loads",
            "Versions put in service (loaded) or refused (rejected)",
            ["model", "result"],
            registry=r,
        )
        self.in_flight = Gauge(
            "bert_in_flight_requests", "Requests being served", registry=r, multiprocess_mode="livesum"
        )
        # The response cache (RESPONSE_CACHE_MB, app/api/cache.py): bert_cache_hits_total, ...
        self.cache_hits = Counter(
            "bert_cache_hits", "Answers served from the response cache", ["model"], registry=r
        )
        self.cache_misses = Counter(
            "bert_cache_misses", "Cacheable requests computed (not in the cache)", ["model"], registry=r
        )
        self.cache_evictions = Counter(
            "bert_cache_evictions", "Cached answers evicted to fit RESPONSE_CACHE_MB", ["model"], registry=r
        )
        self.cache_bytes = Gauge(
            "bert_cache_bytes", "Bytes the response cache holds", registry=r, multiprocess_mode="livesum"
        )
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)` (values in the metric's label order), cached: the per-request
        counters and histograms skip prometheus_client's lock and label checks. Only for metrics
        whose children are never removed (not the gauges forget_model drops)."""
        try:
            return self._children[metric, values]
        except KeyError:
            child = self._children[metric, values] = metric.labels(*values)
            return child

    def observer(self, task: str, model: str) -> BatcherMetrics:
        return BatcherMetrics(self, task, model)

    def forget_model(self, task: str, model: str) -> None:
        """An unloaded model's gauges go away instead of freezing at their last value."""
        for gauge, labels in (
            (self.queue_depth, (task, model)),
            (self.model_ready, (task, model)),
            (self.model_memory, (model,)),
        ):
            try:
                gauge.remove(*labels)
            except KeyError:
                pass

    def render(self) -> bytes:
        """This process's metrics; with several processes (PROMETHEUS_MULTIPROC_DIR, set by
        app/serve.py), every process's, added up: any front end's /metrics shows the whole service."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)
            return generate_latest(merged)
        return generate_latest(self.registry)


class BatcherMetrics:
    """The batcher's observer hooks, bound to one model's labels."""

    def __init__(self, metrics: Metrics, task: str, model: str):
        self._batch = metrics.batch_size.labels(task=task, model=model)
        self._tokens = metrics.batch_tokens.labels(task=task, model=model)
        self._depth = metrics.queue_depth.labels(task=task, model=model)
        self._metrics, self._task, self._model = metrics, task, model

    def on_batch(self, items: int, rows: int, padded_tokens: int) -> None:
        self._batch.observe(items)
        self._tokens.observe(padded_tokens)

    def on_queue_depth(self, depth: int) -> None:
        self._depth.set(depth)

    def on_rejected(self, reason: str, count: int) -> None:
        self._metrics.rejected.labels(task=self._task, reason=reason, model=self._model).inc(count)
