"""Deadlines and priorities through the service, for native and V2 requests alike: the model is made
slow by a runtime that runs a batch only when the test opens its gate, so what is queued, dropped
and computed first is decided by the test, never by timing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tests.app.conftest import bundle_of, serving


class GatedRuntime:
    """The model's own runtime behind a gate; records the sequence length of every row it computes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.lengths: list[int] = []

    def run(self, inputs: dict) -> dict:
        self.lengths += [int(mask.sum()) for mask in inputs["attention_mask"]]
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return self.inner.run(inputs)


SLOW = {"inline_batch_tokens": 0, "max_batch_size": 1, "model_instances": 1, "max_wait_ms": 0}


async def gated(app: Any, task: str) -> GatedRuntime:
    batcher = bundle_of(app, task).batcher
    batcher.runtime = runtime = GatedRuntime(batcher.runtime)
    return runtime


async def queued(app: Any, task: str, depth: int) -> None:
    """Wait until `depth` work items are queued behind the gate (a synchronisation, not a timing)."""
    batcher = bundle_of(app, task).batcher
    while batcher.depth < depth:
        await asyncio.sleep(0.002)


async def occupy(client: Any, runtime: GatedRuntime) -> asyncio.Task:
    """A first request that holds the model until the gate opens."""
    first = asyncio.create_task(client.post("/classify", json={"text": "first"}))
    while not runtime.entered.is_set():
        await asyncio.sleep(0.002)
    return first


@pytest.mark.parametrize(
    "how",
    ["header", "field", "v2 parameter", "triton timeout"],
)
async def test_a_request_past_its_deadline_is_answered_504_and_never_computed(models_dir, how):
    async with serving(models_dir, **SLOW) as (app, client):
        runtime = await gated(app, "classify")
        first = await occupy(client, runtime)
        text = "a request that waits too long in the queue"
        if how.startswith("v2") or how.startswith("triton"):
            parameters = {"timeout_ms": 30} if how == "v2 parameter" else {"timeout": 30_000}
            tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}
            late = await client.post(
                "/v2/models/classify/infer", json={"inputs": [tensor], "parameters": parameters}
            )
            assert late.status_code == 504 and set(late.json()) == {"error"}
            message = late.json()["error"]
        else:
            body, headers = {"text": text}, {}
            if how == "header":
                headers["X-Timeout-Ms"] = "30"
            else:
                body["timeout_ms"] = 30
            late = await client.post("/classify", json=body, headers=headers)
            assert late.status_code == 504, late.text
            assert late.json()["error"] == "deadline_exceeded"
            message = late.json()["message"]
        assert "timeout_ms=30" in message and "before the model computed it" in message
        runtime.gate.set()
        assert (await first).status_code == 200
        ok = await client.post("/classify", json={"text": "afterwards", "timeout_ms": 60_000})
        assert ok.status_code == 200
        assert len(runtime.lengths) == 2  # "first" and "afterwards": the late one never reached the model
        metrics = (await client.get("/metrics")).text
        assert 'bert_rejected_total{model="classify",reason="expired",task="classify"} 1.0' in metrics
        assert 'status="504"' in metrics


async def test_high_priority_is_served_first_and_normal_work_still_completes(models_dir):
    async with serving(models_dir, **SLOW) as (app, client):
        runtime = await gated(app, "classify")
        first = await occupy(client, runtime)
        normal = asyncio.create_task(client.post("/classify", json={"text": "normal"}))
        await queued(app, "classify", 1)
        high_by_header = asyncio.create_task(
            client.post("/classify", json={"text": "high priority"}, headers={"X-Priority": "high"})
        )
        await queued(app, "classify", 2)
        high_by_field = asyncio.create_task(
            client.post("/classify", json={"text": "also high priority", "priority": "high"})
        )
        await queued(app, "classify", 3)
        tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["v2 high priority request"]}
        high_by_v2 = asyncio.create_task(
            client.post("/v2/models/classify/infer", json={"inputs": [tensor], "parameters": {"priority": 1}})
        )
        await queued(app, "classify", 4)
        runtime.gate.set()
        responses = await asyncio.gather(first, normal, high_by_header, high_by_field, high_by_v2)
        assert [r.status_code for r in responses] == [200] * 5
        order = ["first", "high priority", "also high priority", "v2 high priority request", "normal"]
        lengths = [len(bundle_of(app, "classify").tokenizer.encode(text)) for text in order]
        assert len(set(lengths[1:])) == 4  # each request recognisable by its length
        assert runtime.lengths == lengths  # the high ones in arrival order, then the normal one


async def test_bad_schedule_values_are_named(served):
    _, client = served
    for headers, field in (
        ({"X-Timeout-Ms": "soon"}, "X-Timeout-Ms"),
        ({"X-Timeout-Ms": "0"}, "X-Timeout-Ms"),
        ({"X-Priority": "urgent"}, "X-Priority"),
    ):
        r = await client.post("/ner", json={"text": "john"}, headers=headers)
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == field, r.text
    for body, field in (({"timeout_ms": 0}, "timeout_ms"), ({"priority": "urgent"}, "priority")):
        r = await client.post("/ner", json={"text": "john", **body})
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == field, r.text
    ok = await client.post("/ner", json={"text": "john", "timeout_ms": 60_000, "priority": "normal"})
    assert ok.status_code == 200
