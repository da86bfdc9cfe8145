"""Batching through the whole service: concurrency, overload and clients that go away."""

from __future__ import annotations

import asyncio
import json
import random
import threading

import pytest

from tests.app.conftest import bundle_of, serving

WORDS = "the movie was great fun boring bad paris france john smith lives in london city river".split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def mixed_requests(seed: int = 0) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    out: list[tuple[str, dict]] = []
    for n in range(8):
        out.append(("/classify", {"text": sentence(rng, 3 + 5 * n)}))
        out.append(
            ("/ner", {"text": sentence(rng, 4 + 9 * n), "aggregation": rng.choice(["first", "simple"])})
        )
        out.append(("/qa", {"question": sentence(rng, 3), "context": sentence(rng, 20 + 30 * n), "top_k": 2}))
        choices = [sentence(rng, 2 + k) for k in range(2 + n % 3)]
        out.append(("/multiple-choice", {"context": sentence(rng, 6 + n), "choices": choices}))
    out.append(("/classify", {"inputs": [{"text": sentence(rng, 5)}, {"text": sentence(rng, 9)}]}))
    return out


def assert_same(a, b, path: str) -> None:
    """Equal structure and strings; floats equal up to float32 rounding."""
    if isinstance(a, float):
        assert b == pytest.approx(a, abs=1e-5), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for n, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{n}]")
    else:
        assert a == b, path


async def test_concurrent_requests_get_their_own_answers(models_dir):
    # fp32 (fused) variant: int8 dynamic quantization scales activations per batch, so its
    # outputs legitimately shift a little with whatever else shares the batch.
    requests = mixed_requests()
    async with serving(models_dir, cpu_variant="fused", max_wait_ms=20) as (app, client):
        alone = []
        for path, body in requests:
            r = await client.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
            alone.append(r.json())
        shuffled = list(range(len(requests)))
        random.Random(1).shuffle(shuffled)
        responses = await asyncio.gather(
            *(client.post(*requests[i][:1], json=requests[i][1]) for i in shuffled)
        )
        for i, r in zip(shuffled, responses, strict=True):
            assert r.status_code == 200, r.text
            assert_same(alone[i], r.json(), requests[i][0])
        # They really were batched: some batches held more than one item.
        text = (await client.get("/metrics")).text
        for task in ("classify", "ner", "qa"):
            line = next(
                x
                for x in text.splitlines()
                if x.startswith(f'bert_batch_size_bucket{{le="1.0",model="{task}",task="{task}"}}')
            )
            count = next(
                x
                for x in text.splitlines()
                if x.startswith(f'bert_batch_size_count{{model="{task}",task="{task}"}}')
            )
            assert float(line.split()[-1]) < float(count.split()[-1]), task  # some batch held > 1 item


class GatedRuntime:
    """Wraps the real session; holds every batch until the test opens the gate."""

    def __init__(self, inner):
        self.inner, self.gate, self.entered = inner, threading.Event(), threading.Event()
        self.rows: list[int] = []

    def run(self, inputs):
        self.entered.set()
        assert self.gate.wait(20), "gate never opened"
        self.rows.append(len(inputs["input_ids"]))
        return self.inner.run(inputs)


async def until(predicate, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition never became true"
        await asyncio.sleep(0.005)


def gate(app, task: str) -> GatedRuntime:
    batcher = bundle_of(app, task).batcher
    gated = GatedRuntime(batcher.runtime)
    batcher.runtime = gated
    batcher.inline_tokens = 0  # a held batch must hold a worker thread, not the event loop
    return gated


async def test_overload_answers_429_at_once(models_dir):
    # One instance: the first request holds the model, the next ones queue behind it.
    async with serving(models_dir, max_queue=2, max_batch_size=1, max_wait_ms=0, model_instances=1) as (
        app,
        client,
    ):
        gated = gate(app, "classify")
        first = asyncio.create_task(client.post("/classify", json={"text": "one"}))
        await until(gated.entered.is_set)  # in the model, off the queue
        queued = [asyncio.create_task(client.post("/classify", json={"text": t})) for t in ("two", "three")]
        batcher = bundle_of(app, "classify").batcher
        await until(lambda: batcher.depth == 2)
        loop = asyncio.get_running_loop()
        began = loop.time()
        refused = await client.post("/classify", json={"text": "four"})
        assert loop.time() - began < 1.0
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"] == "overloaded"
        gated.gate.set()
        assert [r.status_code for r in await asyncio.gather(first, *queued)] == [200, 200, 200]
        # Once drained, the same request is served.
        assert (await client.post("/classify", json={"text": "four"})).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'bert_rejected_total{model="classify",reason="queue_full",task="classify"} 1.0' in metrics
        assert 'bert_requests_total{endpoint="/classify",model="classify",status="429"} 1.0' in metrics


async def test_request_larger_than_the_queue_is_413(models_dir):
    async with serving(models_dir, max_queue=4) as (_, client):
        context = " ".join(["paris"] * 400)  # ~8 windows of 64 tokens
        r = await client.post("/qa", json={"question": "where?", "context": context})
        assert r.status_code == 413 and r.json()["error"] == "too_large"


async def raw_request(app, path: str, body: dict, disconnect: asyncio.Event) -> list[dict]:
    """Drive the ASGI app directly so the client can vanish mid-request (httpx cannot)."""
    sent: list[dict] = []
    payload = json.dumps(body).encode()
    messages = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        "client": ("test", 1),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    return sent


async def test_work_of_a_vanished_client_is_dropped(models_dir):
    async with serving(models_dir, max_batch_size=1, max_wait_ms=0, model_instances=1) as (app, client):
        gated = gate(app, "qa")
        busy = asyncio.create_task(client.post("/qa", json={"question": "who?", "context": "john"}))
        await until(gated.entered.is_set)
        gone = asyncio.Event()
        context = " ".join(["paris"] * 200)  # several windows, all queued behind `busy`
        vanishing = asyncio.create_task(
            raw_request(app, "/qa", {"question": "where?", "context": context}, gone)
        )
        batcher = bundle_of(app, "qa").batcher
        await until(lambda: batcher.depth >= 3)
        queued = batcher.depth
        gone.set()  # the client disconnects while its windows wait
        sent = await vanishing
        assert sent[0]["status"] == 499
        gated.gate.set()
        assert (await busy).status_code == 200
        await until(lambda: batcher.depth == 0)
        assert gated.rows == [1]  # only `busy` ever reached the model
        metrics = (await client.get("/metrics")).text
        assert f'bert_rejected_total{{model="qa",reason="cancelled",task="qa"}} {float(queued)}' in metrics
