"""Model instances (sessions side by side), arena shrinking after large runs only, inline tokenizing."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from app.api.serving.task_service import INLINE_CHARS, cpu_step
from app.engine.batch_types import ComputeSlots, WorkItem
from app.engine.batcher import Batcher
from app.engine.runtime import (
    OrtRuntime,
    RuntimePool,
    resolve_batch_tokens,
    resolve_instances,
    resolve_padding_factor,
)
from app.settings import available_cores
from tests.app.conftest import bundle_of, serving
from tests.app.test_batching import assert_same, mixed_requests


def test_resolve_instances():
    # One single-threaded session per core for every model, however many are loaded: the shared
    # compute slots bound all models' batches together, so a busy model may use every core.
    assert resolve_instances(0, "cpu", cores=2) == 2
    assert resolve_instances(0, "cpu", cores=16) == 16
    assert resolve_instances(0, "cpu", cores=1) == 1
    assert resolve_instances(0, "cuda", cores=16) == 1
    assert resolve_instances(3, "cpu", cores=2) == 3  # explicit MODEL_INSTANCES wins


def test_batching_limits_follow_the_device_unless_set():
    assert resolve_batch_tokens(None, "cpu") == 1024 and resolve_batch_tokens(None, "cuda") == 8192
    assert resolve_batch_tokens(300, "cuda") == 300
    assert resolve_padding_factor(None, "cpu") == 1.1 and resolve_padding_factor(None, "cuda") == 0.0
    assert resolve_padding_factor(0, "cpu") == 0 and resolve_padding_factor(2.0, "cuda") == 2.0


async def test_models_reports_the_limits_in_force(served, models_dir):
    _, client = served
    limits = (await client.get("/models")).json()["models"][0]["limits"]
    assert (limits["max_batch_tokens"], limits["max_padding_factor"]) == (1024, 1.1)
    async with serving(models_dir, max_batch_tokens=300, max_padding_factor=0) as (_, client):
        limits = (await client.get("/models")).json()["models"][0]["limits"]
        assert (limits["max_batch_tokens"], limits["max_padding_factor"]) == (300, 0)


class Recorder:
    """A runtime that records how many runs overlap, held inside run() until `release` is set."""

    def __init__(self, shared: dict, release: threading.Event):
        self.shared, self.release = shared, release

    def run(self, inputs):
        with self.shared["lock"]:
            self.shared.setdefault("sizes", []).append(len(inputs["x"]))
            self.shared["now"] += 1
            self.shared["peak"] = max(self.shared["peak"], self.shared["now"])
        self.release.wait(5)
        with self.shared["lock"]:
            self.shared["now"] -= 1
        return {"logits": inputs["x"].astype(np.float32)}


def overlap_state() -> dict:
    return {"lock": threading.Lock(), "now": 0, "peak": 0}


def held_pool(instances: int) -> tuple[RuntimePool, dict, threading.Event]:
    """A pool of `instances` Recorders sharing one overlap state, all held until release is set."""
    state, release = overlap_state(), threading.Event()
    return RuntimePool([Recorder(state, release) for _ in range(instances)]), state, release  # type: ignore[list-item]


def started_batcher(instances: int, max_batch_size: int) -> tuple[Batcher, dict, threading.Event]:
    pool, state, release = held_pool(instances)
    batcher = Batcher(pool, collate, max_batch_size=max_batch_size, max_wait_ms=0, concurrency=instances)
    batcher.start()
    return batcher, state, release


@pytest.mark.parametrize("instances", [1, 2])
def test_runtime_pool_runs_at_most_one_batch_per_instance(instances):
    pool, state, release = held_pool(instances)
    threads = [threading.Thread(target=pool.run, args=({"x": np.ones((1, 1))},)) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert state["now"] == instances  # the third caller waits for a free instance
    release.set()
    for t in threads:
        t.join(5)
    assert state["peak"] == instances and state["now"] == 0


def collate(payloads):
    return {"x": np.array([[p] for p in payloads], dtype=np.int64)}


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_batcher_runs_up_to_concurrency_batches_at_once(concurrency):
    batcher, state, release = started_batcher(concurrency, max_batch_size=1)
    futures = batcher.submit([WorkItem(payload=n, length=1) for n in range(4)])
    await asyncio.sleep(0.2)
    assert state["now"] == concurrency  # batches of one item each, `concurrency` of them running
    assert batcher.depth == 4 - concurrency
    release.set()
    results = await asyncio.gather(*futures)
    assert [float(r.outputs["logits"][0]) for r in results] == [0.0, 1.0, 2.0, 3.0]  # each its own row
    assert state["peak"] == concurrency
    await batcher.stop()


async def test_queued_work_is_shared_between_idle_instances():
    """One request's windows spread over the idle instances instead of one big batch."""
    batcher, state, release = started_batcher(2, max_batch_size=32)
    futures = batcher.submit([WorkItem(payload=n, length=5) for n in range(5)])
    await asyncio.sleep(0.2)
    assert state["now"] == 2 and sorted(state["sizes"]) == [2, 3]  # 5 items: 3 + 2, both busy
    release.set()
    results = await asyncio.gather(*futures)
    assert [float(r.outputs["logits"][0]) for r in results] == [0.0, 1.0, 2.0, 3.0, 4.0]
    await batcher.stop()


async def test_stop_drains_batches_still_running_on_other_instances():
    batcher, _, release = started_batcher(2, max_batch_size=1)
    futures = batcher.submit([WorkItem(payload=n, length=1) for n in range(3)])
    await asyncio.sleep(0.1)
    stopping = asyncio.create_task(batcher.stop(drain=True))
    await asyncio.sleep(0.1)
    assert not stopping.done()  # waits for the running and the queued batch
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert all(f.done() and not f.exception() for f in futures)


class CountingSession:
    """A stand-in session that records the run options of every run."""

    def __init__(self):
        self.options_seen: list[object] = []

    def get_inputs(self):
        from types import SimpleNamespace

        return [SimpleNamespace(name="input_ids")]

    def get_outputs(self):
        from types import SimpleNamespace

        return [SimpleNamespace(name="logits")]

    def get_providers(self):
        return ["CPUExecutionProvider"]

    def run(self, names, feed, options=None):
        self.options_seen.append(options)
        return [feed["input_ids"].astype(np.float32)]


def test_arena_shrinks_only_after_runs_above_the_token_threshold():
    session, shrink = CountingSession(), object()
    runtime = OrtRuntime(session, "cpu", run_options=shrink, run_options_above_tokens=64)
    runtime.run({"input_ids": np.ones((4, 16), np.int64)})  # 64 padded tokens: small
    runtime.run({"input_ids": np.ones((4, 17), np.int64)})  # 68: large
    assert session.options_seen == [None, shrink]
    always = OrtRuntime(session, "cpu", run_options=shrink)  # threshold 0: every run
    always.run({"input_ids": np.ones((1, 1), np.int64)})
    assert session.options_seen[-1] is shrink


async def test_cpu_step_runs_small_inputs_inline_and_large_ones_in_a_thread():
    here = threading.get_ident()
    assert await cpu_step(INLINE_CHARS, threading.get_ident) == here
    assert await cpu_step(INLINE_CHARS + 1, threading.get_ident) != here


async def test_two_instances_serve_every_endpoint_with_the_same_answers(models_dir):
    requests = mixed_requests(seed=3)
    async with serving(models_dir, cpu_variant="fused", model_instances=1) as (_, client):
        alone = [(await client.post(path, json=body)).json() for path, body in requests]
    async with serving(models_dir, cpu_variant="fused", model_instances=2, intra_op_threads=1) as (
        app,
        client,
    ):
        models = {m["task"]: m for m in (await client.get("/models")).json()["models"]}
        assert all(models[t]["instances"] == 2 and models[t]["intra_op_threads"] == 1 for t in models)
        assert len(bundle_of(app, "qa").runtime.runtimes) == 2
        responses = await asyncio.gather(*(client.post(path, json=body) for path, body in requests))
    for (path, _), expected, response in zip(requests, alone, responses, strict=True):
        assert response.status_code == 200, (path, response.text)
        assert_same(expected, response.json(), path)


class ThreadRecorder:
    def __init__(self):
        self.threads: list[int] = []

    def run(self, inputs):
        self.threads.append(threading.get_ident())
        return {"logits": inputs["x"].astype(np.float32)}


async def test_small_batch_in_an_idle_model_runs_on_the_event_loop():
    runtime, loop_thread = ThreadRecorder(), threading.get_ident()
    batcher = Batcher(runtime, collate, max_wait_ms=0, inline_tokens=16)
    batcher.start()
    await asyncio.gather(*batcher.submit([WorkItem(payload=1, length=16)]))  # 16 tokens: inline
    await asyncio.gather(*batcher.submit([WorkItem(payload=1, length=17)]))  # 17: worker thread
    await asyncio.gather(*batcher.submit([WorkItem(payload=1, length=9), WorkItem(payload=2, length=9)]))
    assert runtime.threads[0] == loop_thread
    assert runtime.threads[1] != loop_thread and runtime.threads[2] != loop_thread  # 2 x 9 = 18 > 16
    never = Batcher(runtime, collate, max_wait_ms=0)  # inline_tokens=0: always a worker thread
    never.start()
    await asyncio.gather(*never.submit([WorkItem(payload=1, length=1)]))
    assert runtime.threads[3] != loop_thread
    await batcher.stop()
    await never.stop()


async def test_only_a_lone_request_runs_on_the_event_loop():
    """Other requests in the process (lone_request false) keep the loop free to receive them."""
    runtime, loop_thread, lone = ThreadRecorder(), threading.get_ident(), [False]
    batcher = Batcher(runtime, collate, max_wait_ms=0, inline_tokens=16, lone_request=lambda: lone[0])
    batcher.start()
    await asyncio.gather(*batcher.submit([WorkItem(payload=1, length=4)]))
    lone[0] = True
    await asyncio.gather(*batcher.submit([WorkItem(payload=1, length=4)]))
    assert runtime.threads[0] != loop_thread and runtime.threads[1] == loop_thread
    await batcher.stop()


async def test_the_app_s_lone_request_is_its_in_flight_count(models_dir):
    async with serving(models_dir) as (app, _):
        state = app.state.service_state
        batcher = state.registry.serving("classify", None).batcher
        assert batcher.lone_request is not None
        state.in_flight.count = 1  # this request alone
        assert batcher.lone_request()
        state.in_flight.count = 2
        assert not batcher.lone_request()
        state.in_flight.count = 0


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("200000 100000\n", 2),
        ("150000 100000\n", 2),
        ("50000 100000\n", 1),
        ("max 100000\n", None),
        ("", None),
    ],
)
def test_cgroup_cpu_quota_is_read(tmp_path, content, expected):
    from app.settings import cgroup_cpu_limit

    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text(content)
    assert cgroup_cpu_limit(cpu_max) == expected
    assert cgroup_cpu_limit(tmp_path / "absent") is None


def test_available_cores_are_capped_by_the_quota(tmp_path):
    import os

    from app.settings import available_cores

    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one CPU's worth
    assert available_cores(tmp_path / "cpu.max") == 1
    (tmp_path / "cpu.max").write_text(f"{100000 * (affinity + 4)} 100000\n")  # more than we may run on
    assert available_cores(tmp_path / "cpu.max") == affinity


class SoloRecorder:
    """A pool-like runtime that records which path ran each batch; held inside run() on demand."""

    def __init__(self):
        self.paths: list[str] = []
        self.gate: threading.Event | None = None

    def run(self, inputs):
        self.paths.append("pool")
        if self.gate is not None:
            assert self.gate.wait(10)
        return {"logits": inputs["x"].astype(np.float32)}

    def run_alone(self, inputs):
        self.paths.append("solo")
        return {"logits": inputs["x"].astype(np.float32)}


async def test_only_a_batch_alone_in_an_idle_model_goes_to_the_solo_session():
    runtime = SoloRecorder()
    batcher = Batcher(runtime, collate, max_wait_ms=0, concurrency=2, max_batch_size=1)
    batcher.start()
    await asyncio.gather(*batcher.submit([WorkItem(payload=1, length=4)]))
    assert runtime.paths == ["solo"]
    # Three items at once: the first batch leaves two queued and the second runs beside the first,
    # so neither is alone (the third may be, once both are done).
    runtime.gate = threading.Event()
    futures = batcher.submit([WorkItem(payload=n, length=4) for n in range(3)])
    await asyncio.sleep(0.05)
    runtime.gate.set()
    await asyncio.gather(*futures)
    assert runtime.paths[1:3] == ["pool", "pool"] and len(runtime.paths) == 4
    await batcher.stop()


async def test_a_lone_batch_runs_alone_only_while_no_other_model_computes():
    slots = ComputeSlots(2)
    runtime = SoloRecorder()
    batcher = Batcher(runtime, collate, max_wait_ms=0, concurrency=2, max_batch_size=1, compute=slots)
    batcher.start()
    await slots.acquire()  # another model's batch holds a core
    await asyncio.gather(*batcher.submit([WorkItem(payload=1, length=4)]))
    assert runtime.paths == ["pool"] and slots.held == 1
    slots.release()  # the device is idle again: a lone batch may have every core
    await asyncio.gather(*batcher.submit([WorkItem(payload=2, length=4)]))
    assert runtime.paths == ["pool", "solo"] and slots.held == 0
    await batcher.stop()


def test_pool_runs_alone_batches_on_its_solo_session_when_free():
    class Named:
        def __init__(self, name: str, threads: int):
            self.name, self.threads = name, threads

        def run(self, inputs):
            return {"by": np.array([self.name])}

    one = Named("one", 1)
    pool = RuntimePool([one], solo=Named("solo", 2))
    assert pool.solo_threads == 2
    assert pool.run_alone({})["by"][0] == "solo" and pool.run({})["by"][0] == "one"
    with pool._solo_lock:  # the solo session busy: a second lone batch takes a pool session
        assert pool.run_alone({})["by"][0] == "one"
    assert RuntimePool([one]).run_alone({})["by"][0] == "one" and RuntimePool([one]).solo_threads is None


@pytest.mark.skipif(available_cores() < 2, reason="the solo session needs two cores or more")
async def test_every_model_gets_the_same_sessions_however_many_are_loaded(served, app_bundles, tmp_path):
    cores = available_cores()
    _, client = served  # several models share the cores, not split them
    layouts = {
        (m["instances"], m["intra_op_threads"], m["solo_threads"])
        for m in (await client.get("/models")).json()["models"]
    }
    assert layouts == {(cores, 1, cores)}
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "m").symlink_to(app_bundles["classify"], target_is_directory=True)
    async with serving(alone, model_instances=2, intra_op_threads=1) as (_, client):
        (model,) = (await client.get("/models")).json()["models"]
        assert (model["instances"], model["intra_op_threads"], model["solo_threads"]) == (2, 1, 2)
        lone = (await client.post("/classify", json={"text": "a short one"})).json()
        batch = await client.post(
            "/classify", json={"inputs": [{"text": "a short one"}, {"text": "a much longer text " * 20}]}
        )
        assert batch.json()["results"][0] == lone  # all cores alone, one core in a batch: same answer
    async with serving(alone, model_instances=2, intra_op_threads=1, solo_session=False) as (_, client):
        assert (await client.get("/models")).json()["models"][0]["solo_threads"] is None
