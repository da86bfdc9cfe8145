"""The batcher alone, with a fake runtime that records every batch it is given."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from app.engine.batch_types import BatcherClosed, ItemResult, QueueFull, TooLarge, WorkItem
from app.engine.batcher import Batcher


def collate(payloads: list[np.ndarray]) -> dict[str, np.ndarray]:
    longest = max(len(p) for p in payloads)
    ids = np.zeros((len(payloads), longest), dtype=np.int64)
    for row, payload in enumerate(payloads):
        ids[row, : len(payload)] = payload
    return {"input_ids": ids}


class FakeRuntime:
    """Sums each row's ids, so every item's answer is checkable; can block or fail on demand."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []
        self.batches: list[list[int]] = []  # first id of each row, to identify items
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail_on: int | None = None  # an item whose batch raises

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = inputs["input_ids"]
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10), "test never opened the gate"
        self.shapes.append(ids.shape)
        self.batches.append([int(row[0]) for row in ids])
        if self.fail_on is not None and self.fail_on in self.batches[-1]:
            raise RuntimeError("boom")
        return {"total": ids.sum(axis=1).astype(np.float32)}


def item(tag: int, length: int, **kwargs) -> WorkItem:
    """An item whose first id is `tag` (ids are 1..), so batches can be traced back to items."""
    payload = np.full(length, 1, dtype=np.int64)
    payload[0] = tag
    return WorkItem(payload=payload, length=length, **kwargs)


class RecordingObserver:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, int]] = []
        self.depths: list[int] = []
        self.rejected: dict[str, int] = {}

    def on_batch(self, items: int, rows: int, padded_tokens: int) -> None:
        self.batches.append((items, rows, padded_tokens))

    def on_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def on_rejected(self, reason: str, count: int) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + count


async def started(runtime: FakeRuntime, **kwargs) -> Batcher:
    batcher = Batcher(runtime, collate, name="test", **kwargs)
    batcher.start()
    return batcher


async def test_every_item_gets_its_own_row():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_wait_ms=20)
    items = [item(tag=100 + n, length=3 + n) for n in range(10)]
    results: list[ItemResult] = await asyncio.gather(*batcher.submit(items))
    for it, result in zip(items, results, strict=True):
        assert result.outputs["total"] == pytest.approx(float(it.payload.sum()))
    assert len(runtime.batches) < len(items)  # they really were batched
    await batcher.stop()


async def test_max_batch_size():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_batch_size=3, max_wait_ms=50)
    futures = batcher.submit([item(n + 1, 5) for n in range(7)])
    await asyncio.gather(*futures)
    assert sorted(len(b) for b in runtime.batches) == [1, 3, 3]
    await batcher.stop()


async def test_token_budget_counts_padding():
    runtime = FakeRuntime()
    observer = RecordingObserver()
    batcher = await started(runtime, max_batch_tokens=40, max_wait_ms=50, observer=observer)
    # Four 10-token items fill 4 x 10 = 40; the 20-token one would make it 20 x 5 = 100.
    futures = batcher.submit([item(n + 1, 10) for n in range(4)] + [item(9, 20)])
    await asyncio.gather(*futures)
    assert sorted(runtime.shapes) == [(1, 20), (4, 10)]
    assert all(tokens <= 40 for _, _, tokens in observer.batches)
    # An item larger than the whole budget still runs, alone.
    (result,) = await asyncio.gather(*batcher.submit([item(7, 50)]))
    assert runtime.shapes[-1] == (1, 50) and result.batch_size == 1
    await batcher.stop()


async def test_padding_factor_keeps_long_items_apart():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_wait_ms=50, max_padding_factor=1.5)
    # Six 10-token items and one 100-token item: together they would pad 7 x 100 = 700 tokens
    # for 160 real ones, so the long one runs on its own.
    futures = batcher.submit([item(n + 1, 10) for n in range(6)] + [item(9, 100)])
    await asyncio.gather(*futures)
    assert sorted(runtime.shapes) == [(1, 100), (6, 10)]
    await batcher.stop()


async def test_without_padding_factor_lengths_mix():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_wait_ms=50, max_padding_factor=0)
    futures = batcher.submit([item(n + 1, 10) for n in range(6)] + [item(9, 100)])
    await asyncio.gather(*futures)
    assert runtime.shapes == [(7, 100)]
    await batcher.stop()


async def test_rows_count_towards_token_budget():
    """A [choices, seq] item costs choices x seq tokens."""
    runtime = FakeRuntime()
    batcher = await started(runtime, max_batch_tokens=60, max_wait_ms=50)
    futures = batcher.submit([item(n + 1, 10, rows=4) for n in range(3)])  # 40 tokens each
    await asyncio.gather(*futures)
    assert [len(b) for b in runtime.batches] == [1, 1, 1]
    await batcher.stop()


async def test_waits_at_most_max_wait_and_collects_meanwhile():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_wait_ms=80)
    began = time.perf_counter()
    first = batcher.submit([item(1, 4)])
    await asyncio.sleep(0.02)
    second = batcher.submit([item(2, 4)])  # arrives within the first one's wait
    a, b = await asyncio.gather(*first, *second)
    waited = time.perf_counter() - began
    assert a.batch_id == b.batch_id and a.batch_size == 2
    assert 0.07 <= waited < 1.0
    assert a.queue_s >= 0.07
    await batcher.stop()


async def test_zero_wait_runs_at_once():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_wait_ms=0)
    began = time.perf_counter()
    await asyncio.gather(*batcher.submit([item(1, 4)]))
    assert time.perf_counter() - began < 0.05
    await batcher.stop()


async def test_full_batch_does_not_wait():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_batch_size=2, max_wait_ms=5000)
    began = time.perf_counter()
    await asyncio.gather(*batcher.submit([item(1, 4), item(2, 4)]))
    assert time.perf_counter() - began < 1.0
    await batcher.stop()


async def test_groups_by_length_to_cut_padding():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_batch_size=3, max_wait_ms=50)
    lengths = {1: 10, 2: 100, 3: 11, 4: 101, 5: 12, 6: 102}
    await asyncio.gather(*batcher.submit([item(tag, n) for tag, n in lengths.items()]))
    assert [sorted(b) for b in runtime.batches] == [[1, 3, 5], [2, 4, 6]]
    assert runtime.shapes == [(3, 12), (3, 102)]
    await batcher.stop()


async def test_oldest_item_anchors_the_batch():
    """Grouping never starves the oldest item, however many closer-length items keep coming."""
    runtime = FakeRuntime()
    batcher = await started(runtime, max_batch_size=2, max_wait_ms=30)
    oldest = batcher.submit([item(1, 100)])
    others = batcher.submit([item(n, 10) for n in range(2, 8)])
    await asyncio.gather(*oldest, *others)
    assert 1 in runtime.batches[0]
    await batcher.stop()


async def test_shape_keys_never_mix():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_wait_ms=30)
    items = [item(1, 5, shape_key=2), item(2, 5, shape_key=3), item(3, 5, shape_key=2)]
    await asyncio.gather(*batcher.submit(items))
    assert sorted(sorted(b) for b in runtime.batches) == [[1, 3], [2]]
    await batcher.stop()


async def test_queue_full_refuses_at_once_and_recovers():
    runtime = FakeRuntime()
    runtime.gate = threading.Event()
    observer = RecordingObserver()
    batcher = await started(runtime, max_queue=3, max_batch_size=1, max_wait_ms=0, observer=observer)
    running = batcher.submit([item(1, 4)])
    while not runtime.entered.is_set():  # the first item is in the model, off the queue
        await asyncio.sleep(0.005)
    queued = batcher.submit([item(2, 4), item(3, 4)])
    began = time.perf_counter()
    with pytest.raises(QueueFull):
        batcher.submit([item(4, 4), item(5, 4)])  # all or nothing: 2 + 2 > 3
    assert time.perf_counter() - began < 0.05
    assert batcher.depth == 2  # the refused submission left nothing behind
    with pytest.raises(TooLarge):
        batcher.submit([item(n, 4) for n in range(6, 10)])  # could never fit
    queued += batcher.submit([item(10, 4)])  # exactly fills the queue
    runtime.gate.set()
    results = await asyncio.gather(*running, *queued)
    assert len(results) == 4
    assert observer.rejected == {"queue_full": 1, "too_large": 1}
    await batcher.stop()


async def test_cancelled_work_is_dropped():
    runtime = FakeRuntime()
    runtime.gate = threading.Event()
    observer = RecordingObserver()
    batcher = await started(runtime, max_batch_size=1, max_wait_ms=0, observer=observer)
    first = batcher.submit([item(1, 4)])
    while not runtime.entered.is_set():
        await asyncio.sleep(0.005)
    kept, gone = batcher.submit([item(2, 4)]), batcher.submit([item(3, 4)])
    gone[0].cancel()  # the client went away while its item was queued
    runtime.gate.set()
    await asyncio.gather(*first, *kept)
    await asyncio.sleep(0.01)
    assert [b for batch in runtime.batches for b in batch] == [1, 2]
    assert observer.rejected.get("cancelled") == 1
    await batcher.stop()


async def test_failing_batch_fails_only_its_items():
    runtime = FakeRuntime()
    runtime.fail_on = 66
    batcher = await started(runtime, max_wait_ms=20)
    bad = batcher.submit([item(66, 4), item(2, 4)])
    results = await asyncio.gather(*bad, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    # The worker is still alive and serves the next batch.
    (good,) = await asyncio.gather(*batcher.submit([item(3, 4)]))
    assert good.outputs["total"] == pytest.approx(6.0)
    assert batcher.running
    await batcher.stop()


async def test_output_with_wrong_batch_size_is_an_error():
    class Broken(FakeRuntime):
        def run(self, inputs):
            return {"total": np.zeros(len(inputs["input_ids"]) + 1, dtype=np.float32)}

    batcher = await started(Broken(), max_wait_ms=0)
    with pytest.raises(RuntimeError, match="rows for a batch"):
        await asyncio.gather(*batcher.submit([item(1, 4)]))
    await batcher.stop()


async def test_stop_drains_then_refuses():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_wait_ms=10_000, max_batch_size=64)
    futures = batcher.submit([item(n + 1, 4) for n in range(5)])
    await batcher.stop(drain=True)  # does not wait out the 10 s max wait
    assert all(f.done() and not f.cancelled() for f in futures)
    with pytest.raises(BatcherClosed):
        batcher.submit([item(9, 4)])


async def test_stop_without_drain_fails_queued_work():
    runtime = FakeRuntime()
    batcher = await started(runtime, max_wait_ms=10_000, max_batch_size=64)
    futures = batcher.submit([item(1, 4)])
    await batcher.stop(drain=False)
    with pytest.raises(BatcherClosed):
        await futures[0]


async def test_observer_sees_batches_and_depth():
    runtime = FakeRuntime()
    observer = RecordingObserver()
    batcher = await started(runtime, max_wait_ms=30, observer=observer)
    await asyncio.gather(*batcher.submit([item(1, 5), item(2, 7)]))
    assert observer.batches == [(2, 2, 14)]
    assert observer.depths[0] == 2 and observer.depths[-1] == 0
    await batcher.stop()


def test_rejects_nonsense_limits():
    with pytest.raises(ValueError):
        Batcher(FakeRuntime(), collate, max_batch_size=0)
