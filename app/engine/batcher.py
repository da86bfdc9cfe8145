"""Dynamic batching of token sequences for one model. Knows nothing about HTTP or tasks.

Callers submit work items (one token sequence, or one [choices, seq] group) and await
their futures. One worker coroutine per model collects items into batches under three
limits: `max_batch_size` items, `max_batch_tokens` padded tokens (longest x rows, since
padding costs as much compute as real tokens), and `max_wait_ms` from the oldest item's
arrival. The oldest item anchors every batch; the rest are picked by closeness in length to
cut padding. A submission may carry a `Schedule`: a deadline, after which its queued items are
dropped uncomputed (DeadlineExceeded), and a priority. High-priority items anchor batches before
normal ones, but only while the normal ones are younger than `aging_ms`: an older normal item
counts as high, so it is served in arrival order with them (the starvation bound).

Inference runs in dedicated threads so the event loop never blocks: up to `concurrency` batches
at once per model (one per model instance), and, when models share a device, a batch also holds
one of the device's `compute` slots while it runs, so ten models on two cores still run two
batches at a time, and a busy model gets every slot the idle ones do not use.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from app.engine.batch_types import (
    Backlogged,
    BatcherClosed,
    BatchFailed,
    BatchObserver,
    ComputeSlots,
    DeadlineExceeded,
    ItemResult,
    Priority,
    QueueFull,
    Runtime,
    Schedule,
    TooLarge,
    WorkItem,
    _NullObserver,
    padded_tokens,
)

log = logging.getLogger("app.batcher")


class Batcher:
    def __init__(
        self,
        runtime: Runtime,
        collate: Callable[[list[Any]], dict[str, np.ndarray]],
        *,
        split: Callable[[dict[str, np.ndarray], list[Any]], list[dict[str, np.ndarray]]] | None = None,
        max_batch_size: int = 32,
        max_batch_tokens: int = 8192,
        max_wait_ms: float = 5.0,
        max_queue: int = 512,
        max_padding_factor: float = 0.0,
        observer: BatchObserver | None = None,
        name: str = "model",
        concurrency: int = 1,
        inline_tokens: int = 0,
        lone_request: Callable[[], bool] | None = None,
        compute: ComputeSlots | None = None,
        aging_ms: float = 500.0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if max_batch_size < 1 or max_batch_tokens < 1 or max_queue < 1 or max_wait_ms < 0 or aging_ms < 0:
            raise ValueError("batch size, token budget and queue must be positive, max wait and aging >= 0")
        if concurrency < 1:
            raise ValueError("concurrency (batches in flight) must be at least 1")
        self.runtime = runtime
        self.collate = collate
        self.split = split  # outputs -> each item's part (reduce.py, in the thread); None: row i
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        # Measured on the batches run, never seeded from the warm-up: a first run is slow, and a rate
        # read off it refused ordinary /qa requests right after a rolling restart (test_local_stack).
        self.tokens_per_s: float | None = None
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        # Padded tokens may be at most this multiple of real tokens (0 = no limit): on a CPU,
        # padding costs as much as real work, so a long item does not drag short ones along.
        self.max_padding_factor = max_padding_factor
        self.observer = observer or _NullObserver()
        self.name = name
        self._queue: list[WorkItem] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._closing = False
        self._batch_ids = itertools.count(1)
        # The runtime must take `concurrency` runs at once (app.engine.runtime.RuntimePool does).
        self.concurrency = concurrency
        self._in_flight: set[asyncio.Task] = set()
        # A batch of at most this many padded tokens, alone in an idle model, runs on the loop itself:
        # a millisecond of inference, where a worker thread's round trip adds a tenth (0: never).
        self.inline_tokens = inline_tokens
        # And only while the process serves that one request (None: always): the loop it would block
        # is what receives the others. gRPC hands the loop its calls one at a time, so a loop busy with
        # each lone-looking call in turn ran them one by one, never two queued at once.
        self.lone_request = lone_request
        self.compute = compute  # shared by every model on the device: a batch runs holding a slot
        # A normal item this old anchors batches as if it were high priority: the starvation bound.
        self.aging_s = aging_ms / 1000.0
        # Not loop.time(): uvloop's clock ticks in whole milliseconds. Tests pass a clock they move.
        self.clock = clock
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"infer-{name}")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the worker on the running event loop."""
        if self._worker is None:
            self._wake = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self, drain: bool = True) -> None:
        """Refuse new work; with `drain`, finish what is queued first, else fail it."""
        self._closing = True
        if not drain:
            for item in self._queue:
                if item.future is not None and not item.future.done():
                    item.future.set_exception(BatcherClosed())
            self._queue.clear()
        if self._worker is not None:
            assert self._wake is not None
            self._wake.set()
            if not drain:
                self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=False)

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._worker.done()

    # ------------------------------------------------------------------ submitting

    def submit(self, items: Sequence[WorkItem], schedule: Schedule | None = None) -> list[asyncio.Future]:
        """Queue all `items` or none of them; returns one future per item, resolving to ItemResult.

        With a `schedule`, the items share its priority and deadline: if it has passed, or passes
        while any of them is still queued, every queued one is dropped with DeadlineExceeded."""
        if self._closing:
            self.observer.on_rejected(BatcherClosed.reason, 1)
            raise BatcherClosed()
        if self._worker is None or self._wake is None:
            raise RuntimeError(f"batcher {self.name!r} was not started")
        if len(items) > self.max_queue:
            self.observer.on_rejected(TooLarge.reason, 1)
            raise TooLarge(len(items), self.max_queue)
        self._purge_cancelled()
        if len(self._queue) + len(items) > self.max_queue:
            self.observer.on_rejected(QueueFull.reason, 1)
            raise QueueFull(len(self._queue), self.max_queue, len(items))
        self._admit_by_cost(items, schedule)
        loop = asyncio.get_running_loop()
        now = self.clock()
        if schedule is not None and schedule.deadline is not None:
            if schedule.deadline <= now:
                self._count_expired(schedule)
                raise schedule.expired_error(now)
            # Answer at the deadline itself, not when the worker next looks at the queue.
            schedule.timers.append(loop.call_later(schedule.deadline - now, self._at_deadline, schedule))
        futures = []
        for item in items:
            item.future = loop.create_future()
            item.enqueued_at = now
            if schedule is not None:
                item.schedule = schedule
            futures.append(item.future)
        self._queue.extend(items)
        self.observer.on_queue_depth(len(self._queue))
        self._wake.set()
        return futures

    def _admit_by_cost(self, items: Sequence[WorkItem], schedule: Schedule | None) -> None:
        """Refuse a request of more tokens than a batch while the queued work, at the measured rate,
        outlasts its server deadline (MAX_QUEUE_MS): huge requests cannot pile up past it."""
        if schedule is None or not schedule.server or not self.tokens_per_s or schedule.timeout_ms is None:
            return
        tokens = sum(it.length * it.rows for it in items)
        if tokens <= self.max_batch_tokens:
            return
        backlog_s = sum(it.length * it.rows for it in self._queue) / (self.tokens_per_s * self.concurrency)
        if backlog_s > schedule.timeout_ms / 1000:
            self.observer.on_rejected(Backlogged.reason, 1)
            raise Backlogged(backlog_s, schedule.timeout_ms / 1000, tokens)

    # ------------------------------------------------------------------ worker

    def _purge_cancelled(self) -> None:
        # A done future before its batch ran means the caller gave up (client gone): skip the work.
        self._expire_due()
        kept = [item for item in self._queue if item.future is not None and not item.future.done()]
        dropped = len(self._queue) - len(kept)
        if dropped:
            self._queue = kept
            self.observer.on_rejected("cancelled", dropped)
            self.observer.on_queue_depth(len(kept))

    def _count_expired(self, schedule: Schedule) -> None:
        if not schedule.expired:
            schedule.expired = True
            self.observer.on_rejected(DeadlineExceeded.reason, 1)

    def _at_deadline(self, schedule: Schedule) -> None:
        assert schedule.deadline is not None
        left = schedule.deadline - self.clock()
        if left > 0:  # the loop's timer fired a hair early (uvloop counts whole milliseconds)
            asyncio.get_running_loop().call_later(left, self._at_deadline, schedule)
        else:
            self._expire_due()

    def _expire_due(self) -> None:
        """Drop every queued item whose deadline has passed: it is answered now and never computed."""
        now = self.clock()
        due = [it for it in self._queue if it.schedule.due(now)]
        if not due:
            return
        dropped = {id(it) for it in due}
        self._queue = [it for it in self._queue if id(it) not in dropped]
        for item in due:
            self._count_expired(item.schedule)
            if item.future is not None and not item.future.done():
                item.future.set_exception(item.schedule.expired_error(now))
        self.observer.on_queue_depth(len(self._queue))

    def _rank(self, item: WorkItem, now: float) -> tuple[int, int, float]:
        """Anchor order: high priority, or normal but older than aging_s, first; then the request
        with the fewest items batched so far (a small request is not starved behind the hundreds
        of windows of a huge one: requests take turns); then the oldest."""
        aged = now - item.enqueued_at >= self.aging_s
        first = item.schedule.priority is Priority.HIGH or aged
        return (0 if first else 1, item.schedule.taken, item.enqueued_at)

    def plan(self, share: int = 1) -> tuple[list[WorkItem], bool]:
        """The next batch (not yet taken from the queue) and whether a limit was reached.

        With `share` idle instances, the batch takes at most its share of the compatible queued
        items, so one request's windows (or a burst) spread over every idle instance instead of
        queueing behind each other on one.
        """
        now = self.clock()
        anchor = min(self._queue, key=lambda it: self._rank(it, now))  # the first of equals on ties
        candidates = [it for it in self._queue if it.shape_key == anchor.shape_key and it is not anchor]
        # The share caps this batch without making it "full": a lone item may still wait for company.
        share_cap = -(-(len(candidates) + 1) // share) if share > 1 else self.max_batch_size
        # High priority first, then the closest lengths (least padding); ties go to the oldest.
        candidates.sort(key=lambda it: (it.schedule.priority, abs(it.length - anchor.length), it.enqueued_at))
        selected, longest, rows, full = [anchor], anchor.length, anchor.rows, False
        real = anchor.length * anchor.rows
        for item in candidates:
            if len(selected) >= self.max_batch_size:
                full = True
                break
            if len(selected) >= share_cap:
                break
            new_longest = max(longest, item.length)
            padded = new_longest * (rows + item.rows)
            if padded > self.max_batch_tokens:
                full = True  # a shorter item further down may still fit
                continue
            if self.max_padding_factor and padded > self.max_padding_factor * (
                real + item.length * item.rows
            ):
                continue  # too different in length: it anchors a batch of its own later
            selected.append(item)
            longest, rows, real = new_longest, rows + item.rows, real + item.length * item.rows
        return selected, full or len(selected) >= self.max_batch_size

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._purge_cancelled()
                if not self._queue or len(self._in_flight) >= self.concurrency:
                    if not self._queue and self._closing:
                        return
                    # Woken by a submission or by a batch finishing (a free instance).
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                selected, full = self.plan(share=self.concurrency - len(self._in_flight))
                if not full and not self._closing:
                    delay = self._queue[0].enqueued_at + self.max_wait_s - self.clock()
                    if delay > 0:
                        self._wake.clear()
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), delay)
                        continue
                if self.compute is not None:
                    # Other models may hold the device's cores: wait for one, then plan again
                    # with whatever queued (or was cancelled) meanwhile.
                    waited = self.compute.locked()
                    await self.compute.acquire()
                    if waited:
                        self._purge_cancelled()
                        if not self._queue:
                            self.compute.release()
                            continue
                        selected, _ = self.plan(share=self.concurrency - len(self._in_flight))
                # Deadlines are checked last, right before the batch is taken: an item that expired
                # (or was cancelled) since it was planned is never computed; plan again instead.
                self._purge_cancelled()
                if any(it.future is None or it.future.done() for it in selected):
                    if self.compute is not None:
                        self.compute.release()
                    continue
                for item in selected:
                    item.schedule.taken += 1
                taken = {id(it) for it in selected}
                self._queue = [it for it in self._queue if id(it) not in taken]
                self.observer.on_queue_depth(len(self._queue))
                # Alone: nothing else of this model running or queued, and no other model computing.
                alone = not self._in_flight and not self._queue
                alone = alone and (self.compute is None or self.compute.held <= 1)
                inline = alone and padded_tokens(selected) <= self.inline_tokens
                inline = inline and (self.lone_request is None or self.lone_request())
                task = loop.create_task(self._run_batch(selected, loop, inline, alone))
                self._in_flight.add(task)
                task.add_done_callback(self._batch_done)
        finally:
            # Draining or cancelled: batches already running finish and answer their callers.
            if self._in_flight:
                await asyncio.gather(*self._in_flight, return_exceptions=True)

    def _batch_done(self, task: asyncio.Task) -> None:
        self._in_flight.discard(task)
        if self._wake is not None:
            self._wake.set()

    async def _run_batch(
        self, items: list[WorkItem], loop: asyncio.AbstractEventLoop, inline: bool, alone: bool
    ) -> None:
        try:
            await self._infer_batch(items, loop, inline, alone)
        finally:
            if self.compute is not None:
                self.compute.release()

    async def _infer_batch(
        self, items: list[WorkItem], loop: asyncio.AbstractEventLoop, inline: bool, alone: bool
    ) -> None:
        batch_id = next(self._batch_ids)
        started = self.clock()
        self.observer.on_batch(len(items), sum(it.rows for it in items), padded_tokens(items))
        try:
            payloads = [it.payload for it in items]
            if inline:
                outputs = self._infer(payloads, alone)
            else:
                outputs = await loop.run_in_executor(self._executor, self._infer, payloads, alone)
        except Exception as exc:  # noqa: BLE001 - one bad batch must not stop the worker
            log.error(
                "batch failed",
                exc_info=exc,  # the traceback, once per batch
                extra={"model": self.name, "batch_id": batch_id, "items": len(items), "error": repr(exc)},
            )
            for item in items:
                if item.future is not None and not item.future.done():
                    item.future.set_exception(BatchFailed(batch_id, exc))
            return
        inference_s = self.clock() - started
        if inference_s > 0:  # one instance's rate, for admission by cost (smoothed)
            rate = padded_tokens(items) / inference_s
            self.tokens_per_s = rate if not self.tokens_per_s else 0.8 * self.tokens_per_s + 0.2 * rate
        for item, part in zip(items, outputs, strict=True):
            if item.future is None or item.future.done():
                continue
            item.future.set_result(
                ItemResult(part, started - item.enqueued_at, inference_s, batch_id, len(items))
            )

    def _infer(self, payloads: list[Any], alone: bool = False) -> list[dict[str, np.ndarray]]:
        """The batch through the model: each item's part of its outputs."""
        inputs = self.collate(payloads)
        # Alone in an idle model (nothing running, nothing queued): every core may serve it.
        run_alone = getattr(self.runtime, "run_alone", None) if alone else None
        outputs = run_alone(inputs) if run_alone is not None else self.runtime.run(inputs)
        rows = len(payloads)  # one row per item: a sequence, or a choice group's block
        for name, value in outputs.items():
            if len(value) != rows:
                raise RuntimeError(f"output {name!r} has {len(value)} rows for a batch of {rows}")
        if self.split is None:
            return [{name: value[index] for name, value in outputs.items()} for index in range(rows)]
        return self.split(outputs, payloads)
