"""The engine boundary (app/engine/protocol.py): int32 rows in, the model's inputs exactly as the
tokenizer's own padding makes them, each item's outputs back (pooled inside the engine for
embeddings), deadlines as remaining milliseconds, aborts that drop queued work."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app.engine.batch_types import DeadlineExceeded, Schedule
from app.engine.batcher import Batcher
from app.engine.client import Engine
from app.engine.protocol import EngineRequest, Item
from app.engine.reduce import Work, batch_functions, pad_items, split_rows
from app.errors import ModelUnavailable
from processing.embed import pool_tokens
from processing.padding import pad_batch, pad_choices
from processing.tokenizer import Encoding


def encoding(ids: list[int], second: int = 0) -> Encoding:
    n = len(ids)
    types = np.array([0] * (n - second) + [1] * second, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    return Encoding(np.array(ids, dtype=np.int64), types, np.zeros((n, 2), np.int64), zeros, zeros)


def test_padded_items_equal_the_tokenizers_padding() -> None:
    rng = np.random.default_rng(0)
    encodings = [encoding(list(rng.integers(1, 30_000, size=n)), second=n // 3) for n in (3, 17, 9, 1)]
    for pad_id in (0, 7):
        mine = pad_items([Item.of([e]) for e in encodings], pad_id, grouped=False)
        theirs = pad_batch(encodings, pad_id)
        assert mine.keys() == theirs.keys()
        for name in mine:
            assert mine[name].dtype == theirs[name].dtype and np.array_equal(mine[name], theirs[name]), name
    groups = [encodings[:2], encodings[2:]]
    for pad_id in (0, 7):
        mine = pad_items([Item.of(g) for g in groups], pad_id, grouped=True)
        theirs = pad_choices(groups, pad_id)
        assert all(np.array_equal(mine[name], theirs[name]) for name in theirs)
    with pytest.raises(ValueError, match="same number of choices"):
        pad_items([Item.of(encodings[:1]), Item.of(encodings[1:])], 0, grouped=True)


def test_items_cross_as_int32_rows() -> None:
    item = Item.of([encoding([101, 5, 102]), encoding([101, 102])])
    assert item.input_ids.dtype == item.token_type_ids.dtype == item.lengths.dtype == np.int32
    assert item.input_ids.tolist() == [[101, 5, 102], [101, 102, 0]]  # [rows, length]
    assert (item.rows, item.length) == (2, 3)


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_the_engine_pools_each_row_over_its_own_tokens(mode: str) -> None:
    rng = np.random.default_rng(1)
    states = rng.standard_normal((2, 6, 4)).astype(np.float32)  # [batch, seq, hidden]
    work = [Work(Item.of([encoding([1, 2, 3])]), mode), Work(Item.of([encoding([1] * 6)]), None)]
    first, second = split_rows({"last_hidden_state": states}, work)
    assert set(first) == {"pooled"} and np.array_equal(first["pooled"], pool_tokens(states[0, :3], mode))
    assert np.array_equal(second["last_hidden_state"], states[1])  # not asked: the row as it is


class Gate:
    """A runtime that runs a batch only when the test lets it; answers each row's id sum."""

    def __init__(self) -> None:
        self.permits = threading.Semaphore(0)
        self.batches: list[int] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append(len(inputs["input_ids"]))
        assert self.permits.acquire(timeout=10)
        return {"logits": inputs["input_ids"].sum(axis=-1, keepdims=True).astype(np.float32)}


def request(request_id: int, *rows: list[int], deadline_ms: float | None = None) -> EngineRequest:
    items = [Item.of([encoding(r)]) for r in rows]
    return EngineRequest(request_id, "m", "1", items, deadline_ms=deadline_ms, timeout_ms=deadline_ms)


async def engine_with(runtime: Gate) -> tuple[Engine, Batcher]:
    collate, split = batch_functions(0, grouped=False)
    batcher = Batcher(runtime, collate, split=split, max_batch_size=1, max_wait_ms=0, name="m-1")
    batcher.start()
    engine = Engine()
    engine.add("m", "1", batcher)
    return engine, batcher


async def test_a_request_comes_back_per_item_with_its_seconds() -> None:
    runtime = Gate()
    engine, batcher = await engine_with(runtime)
    runtime.permits.release(10)
    reply = await engine.infer(request(5, [1, 2], [3, 4, 5]))
    assert reply.request_id == 5
    assert [item.outputs["logits"].tolist() for item in reply.items] == [[3.0], [12.0]]
    assert all(item.inference_s >= 0 and item.queue_s >= 0 for item in reply.items)
    await batcher.stop()
    with pytest.raises(ModelUnavailable, match="'m' version '2'"):
        await engine.infer(EngineRequest(6, "m", "2", [Item.of([encoding([1])])]))


async def test_an_abort_drops_the_queued_items_unrun() -> None:
    runtime = Gate()
    engine, batcher = await engine_with(runtime)
    first = asyncio.create_task(engine.infer(request(1, [1])))
    while not runtime.batches:  # the first batch holds the model
        await asyncio.sleep(0.001)
    second = asyncio.create_task(engine.infer(request(2, [2], [3])))
    await asyncio.sleep(0.01)
    second.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await second
    runtime.permits.release(10)
    await first
    await batcher.stop()
    assert runtime.batches == [1]  # request 2's items never ran


async def test_a_spent_deadline_is_refused_and_counted_once_per_request() -> None:
    runtime = Gate()
    engine, batcher = await engine_with(runtime)
    with pytest.raises(DeadlineExceeded, match="timeout_ms=0"):
        await engine.infer(request(3, [1], deadline_ms=0.0))
    runtime.permits.release(10)
    reply = await engine.infer(request(4, [1], deadline_ms=60_000.0))
    assert len(reply.items) == 1
    await batcher.stop()
    assert engine._schedules == {}  # nothing of a finished request stays behind


async def test_in_process_the_front_ends_schedule_serves_and_its_timer_goes_with_the_answer() -> None:
    runtime = Gate()
    engine, batcher = await engine_with(runtime)
    runtime.permits.release(10)
    schedule = Schedule.within(60_000.0, server=True)  # MAX_QUEUE_MS's deadline, say
    await engine.infer(request(7, [1], [2], deadline_ms=60_000.0), schedule)
    assert schedule.taken == 2  # the very object the batcher scheduled, not a copy of it
    # Answered: no timer of its deadline stays in the event loop (it would fire a minute later).
    assert schedule.timers and all(timer.cancelled() for timer in schedule.timers)
    await batcher.stop()
