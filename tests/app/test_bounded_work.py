"""Bounded work and fairness (issue 42, finding 6): a request's work waits in the queue at most
MAX_QUEUE_MS unless the client set its own timeout (then 503 with Retry-After, never silence), and a
small request is not starved behind the many windows of a huge one."""

from __future__ import annotations

import asyncio

import pytest

from app.api.error_table import status_of
from app.api.scheduling import schedule_for
from app.engine.batch_types import DeadlineExceeded, QueueTimedOut, Schedule
from tests.app.test_batcher import item
from tests.app.test_deadlines_priorities import StepRuntime, finish, started


async def test_a_small_request_takes_its_turn_between_a_huge_ones_windows():
    runtime = StepRuntime()
    batcher = await started(runtime)  # one item per batch, batches run one at a time
    huge = batcher.submit([item(1, 4)] + [item(2, 4) for _ in range(50)], Schedule.within(None))
    await runtime.started(1)
    small = batcher.submit([item(3, 4)], Schedule.within(None))
    runtime.permits.release(1)
    await runtime.started(2)
    await finish(runtime, batcher, huge + small)
    # Before: the small request ran after all 51 windows of the huge one.
    assert runtime.computed().index(3) == 1


async def test_without_a_client_timeout_the_server_deadline_answers_503():
    runtime = StepRuntime()
    batcher = await started(runtime)
    busy = batcher.submit([item(1, 4)])
    await runtime.started(1)
    waiting = batcher.submit([item(2, 4)], schedule_for({}, max_queue_ms=30))
    (result,) = await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(result, QueueTimedOut) and "MAX_QUEUE_MS" in str(result)
    status = status_of(result)
    assert status.status == 503 and status.retry
    await finish(runtime, batcher, busy)
    assert runtime.computed() == [1]


def test_a_client_timeout_is_the_clients_and_zero_turns_the_server_deadline_off():
    own = schedule_for({"X-Timeout-Ms": "50000"}, max_queue_ms=30)
    assert own.timeout_ms == 50000 and not own.server
    assert schedule_for({}, max_queue_ms=0).deadline is None
    assert schedule_for({}, max_queue_ms=5000).server
    expired = Schedule.within(10.0)
    assert type(expired.expired_error(expired.started + 1)) is DeadlineExceeded


async def test_the_server_deadline_bounds_the_wait_to_start_not_the_work_of_a_started_request():
    """A long request that has started is served to the end (its windows take turns with other
    requests), however long that takes; one that never started by MAX_QUEUE_MS is refused."""
    runtime = StepRuntime()
    batcher = await started(runtime)
    long = batcher.submit([item(1, 4), item(2, 4), item(3, 4)], schedule_for({}, max_queue_ms=30))
    await runtime.started(1)  # its first window is running: the request has started
    await asyncio.sleep(0.06)  # past its server deadline
    await finish(runtime, batcher, long)
    assert all(f.exception() is None for f in long) and runtime.computed() == [1, 2, 3]


async def test_admission_by_cost_refuses_a_large_request_behind_a_backlog_but_not_a_small_one():
    from app.engine.batch_types import Backlogged
    from app.engine.batcher import Batcher
    from tests.app.test_batcher import collate

    runtime = StepRuntime()
    batcher = Batcher(runtime, collate, name="test", max_batch_size=1, max_wait_ms=0, max_batch_tokens=8)
    batcher.start()
    batcher.tokens_per_s = 10.0  # as measured: 10 tokens a second
    busy = batcher.submit([item(1, 4)])
    await runtime.started(1)
    backlog = batcher.submit([item(2, 4) for _ in range(20)], schedule_for({}, max_queue_ms=5000))  # 8 s
    with pytest.raises(Backlogged) as refused:  # 12 tokens > a batch's 8, behind 8 s > 5 s of work
        batcher.submit([item(3, 4), item(3, 4), item(3, 4)], schedule_for({}, max_queue_ms=5000))
    assert status_of(refused.value).status == 429 and "MAX_QUEUE_MS" in str(refused.value)
    small = batcher.submit([item(4, 4)], schedule_for({}, max_queue_ms=5000))  # a batch's worth: admitted
    own = batcher.submit(
        [item(5, 4) for _ in range(3)], schedule_for({"X-Timeout-Ms": "60000"})
    )  # own deadline
    await finish(runtime, batcher, busy + backlog + small + own)
    assert 4 in runtime.computed() and 3 not in runtime.computed()
