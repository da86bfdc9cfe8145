"""Deadlines and priorities in the batcher, with a fake slow runtime that runs a batch only when the
test lets it, and a clock the test moves: every ordering below is decided, never raced."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app.engine.batch_types import DeadlineExceeded, Priority, Schedule, WorkItem
from app.engine.batcher import Batcher
from tests.app.test_batcher import RecordingObserver, collate, item


class StepRuntime:
    """Records each batch as it starts, then blocks until the test releases one run."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []  # first id of each row: the item's tag
        self.permits = threading.Semaphore(0)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append([int(row[0]) for row in inputs["input_ids"]])
        assert self.permits.acquire(timeout=10), "the test never released this batch"
        return {"total": inputs["input_ids"].sum(axis=1).astype(np.float32)}

    def computed(self) -> list[int]:
        return [tag for batch in self.batches for tag in batch]

    async def started(self, count: int) -> None:
        """Wait until `count` batches have started (a synchronisation, not a timing)."""
        while len(self.batches) < count:
            await asyncio.sleep(0.001)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def started(runtime: StepRuntime, **kwargs) -> Batcher:
    batcher = Batcher(runtime, collate, name="test", max_batch_size=1, max_wait_ms=0, **kwargs)
    batcher.start()
    return batcher


async def finish(runtime: StepRuntime, batcher: Batcher, futures: list[asyncio.Future]) -> None:
    runtime.permits.release(100)
    await asyncio.gather(*futures, return_exceptions=True)
    await batcher.stop()


# ---------------------------------------------------------------------------------------- deadlines


async def test_expired_work_is_never_computed():
    runtime, observer = StepRuntime(), RecordingObserver()
    batcher = await started(runtime, observer=observer)
    busy = batcher.submit([item(1, 4)])
    await runtime.started(1)  # the model is busy with item 1 and stays so until released
    late = batcher.submit([item(2, 4), item(3, 4)], Schedule.within(timeout_ms=20))
    # The model is still blocked, so these can only fail by their deadline, answered at once.
    results = await asyncio.gather(*late, return_exceptions=True)
    assert all(isinstance(r, DeadlineExceeded) for r in results)
    assert "timeout_ms=20" in str(results[0]) and "before the model computed it" in str(results[0])
    assert batcher.depth == 0
    after = batcher.submit([item(4, 4)])
    await finish(runtime, batcher, busy + after)
    assert runtime.computed() == [1, 4]  # 2 and 3 never reached the model
    assert observer.rejected == {"expired": 1}  # one request, however many of its items


async def test_a_deadline_already_past_is_refused_at_submit():
    runtime, observer = StepRuntime(), RecordingObserver()
    batcher = await started(runtime, observer=observer)
    gone = Schedule.within(timeout_ms=1)
    gone.deadline = gone.started - 0.001
    with pytest.raises(DeadlineExceeded):
        batcher.submit([item(1, 4)], gone)
    assert batcher.depth == 0 and observer.rejected == {"expired": 1}
    with pytest.raises(DeadlineExceeded):  # a later submission of the same request: not counted again
        batcher.submit([item(2, 4)], gone)
    assert observer.rejected == {"expired": 1}
    await finish(runtime, batcher, [])
    assert runtime.computed() == []


async def test_the_queue_drops_expired_items_when_it_plans_the_next_batch():
    """The check before every batch, apart from the timer: the fake clock moves, no timer fires."""
    clock, runtime = FakeClock(), StepRuntime()
    batcher = await started(runtime, clock=clock)
    busy = batcher.submit([item(1, 4)])
    await runtime.started(1)
    doomed = batcher.submit([item(2, 4)], Schedule(deadline=clock.now + 5.0, timeout_ms=5000))
    kept = batcher.submit([item(3, 4)], Schedule(deadline=clock.now + 60.0))
    clock.now += 10.0  # item 2's deadline passes while the model is busy
    runtime.permits.release(1)
    with pytest.raises(DeadlineExceeded):
        await doomed[0]
    await finish(runtime, batcher, busy + kept)
    assert runtime.computed() == [1, 3]


async def test_part_of_a_request_computed_the_rest_dropped():
    """A request's windows share its deadline: those still queued when it passes are all dropped."""
    clock, runtime, observer = FakeClock(), StepRuntime(), RecordingObserver()
    batcher = await started(runtime, clock=clock, observer=observer)
    schedule = Schedule(deadline=clock.now + 1.0, timeout_ms=1000)
    windows = batcher.submit([item(n, 4) for n in (1, 2, 3)], schedule)
    await runtime.started(1)  # window 1 is being computed
    clock.now += 2.0
    runtime.permits.release(1)
    results = await asyncio.gather(*windows, return_exceptions=True)
    assert not isinstance(results[0], Exception)
    assert all(isinstance(r, DeadlineExceeded) for r in results[1:])
    await finish(runtime, batcher, [])
    assert runtime.computed() == [1] and observer.rejected == {"expired": 1}


# --------------------------------------------------------------------------------------- priorities


async def test_high_priority_is_served_first():
    clock, runtime = FakeClock(), StepRuntime()
    batcher = await started(runtime, clock=clock)
    futures = batcher.submit([item(1, 4)])  # normal, computing
    await runtime.started(1)
    futures += batcher.submit([item(2, 4)])  # normal, queued first
    futures += batcher.submit([item(3, 4)])
    clock.now += 0.01
    futures += batcher.submit([item(4, 4)], Schedule(priority=Priority.HIGH))
    futures += batcher.submit([item(5, 4)], Schedule(priority=Priority.HIGH))
    await finish(runtime, batcher, futures)
    assert runtime.computed() == [1, 4, 5, 2, 3]  # high in arrival order, then normal in arrival order


async def test_high_priority_items_fill_a_batch_before_normal_ones():
    clock, runtime = FakeClock(), StepRuntime()
    batcher = Batcher(runtime, collate, name="test", max_batch_size=3, max_wait_ms=0, clock=clock)
    batcher.start()
    futures = batcher.submit([item(1, 4)])
    await runtime.started(1)
    futures += batcher.submit([item(n, 4) for n in (2, 3, 4)])
    futures += batcher.submit([item(n, 4) for n in (5, 6)], Schedule(priority=Priority.HIGH))
    await finish(runtime, batcher, futures)
    assert [sorted(b) for b in runtime.batches] == [[1], [2, 5, 6], [3, 4]]


@pytest.mark.parametrize("waited, first", [(0.375, 9), (0.5, 2)])
async def test_normal_work_anchors_once_it_has_waited_the_aging_bound(waited, first):
    clock, runtime = FakeClock(), StepRuntime()
    batcher = await started(runtime, clock=clock, aging_ms=500)
    futures = batcher.submit([item(1, 4)])
    await runtime.started(1)
    t0 = clock.now
    futures += batcher.submit([item(2, 4)])  # normal, at t0
    clock.now = t0 + 0.25
    futures += batcher.submit([item(9, 4)], Schedule(priority=Priority.HIGH))  # high, 250 ms later
    clock.now = t0 + waited  # (binary fractions: the clock's sums are exact)
    await finish(runtime, batcher, futures)
    assert runtime.computed()[1] == first


async def test_normal_work_completes_under_a_constant_stream_of_high_priority_work():
    """One high-priority request arrives per batch, forever: the normal one still runs, as soon as it
    has waited aging_ms, and not before (until then every batch went to high-priority work)."""
    clock, runtime = FakeClock(), StepRuntime()
    batcher = await started(runtime, clock=clock, aging_ms=500)
    futures = batcher.submit([item(1, 4)], Schedule(priority=Priority.HIGH))
    await runtime.started(1)
    normal = batcher.submit([item(2, 4)])
    normal_at = clock.now
    served_at = None
    for step in range(12):
        futures += batcher.submit([item(100 + step, 4)], Schedule(priority=Priority.HIGH))
        clock.now += 0.125  # each batch takes 125 ms on the fake clock (exact in binary)
        runtime.permits.release(1)
        await runtime.started(step + 2)
        if runtime.batches[-1] == [2]:
            served_at = clock.now
            break
    assert served_at is not None, f"normal work starved: {runtime.computed()}"
    assert served_at - normal_at == pytest.approx(0.5)  # the bound, to the batch
    assert all(tag != 2 for tag in runtime.computed()[:-1])  # high priority had every batch before
    await finish(runtime, batcher, futures + normal)


def test_priority_is_ordered_like_tritons():
    assert Priority.HIGH < Priority.NORMAL  # lower value, served first
    assert WorkItem(payload=None, length=1).schedule.priority is Priority.NORMAL
