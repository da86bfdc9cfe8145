"""What the batcher takes and gives back: work items and their schedules (deadline, priority),
per-item results, the runtime and observer it is given, and the errors it raises. HTTP-free."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

import numpy as np

from app.engine.protocol import ItemOutput
from app.errors import ServiceError


class Runtime(Protocol):
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class BatcherError(ServiceError):
    reason = "error"


class QueueFull(BatcherError):
    """The queue cannot take the submitted items now; retry later."""

    reason = "queue_full"

    def __init__(self, depth: int, limit: int, wanted: int):
        super().__init__(f"queue is full ({depth} of {limit} work items queued, {wanted} more requested)")
        self.depth, self.limit, self.wanted = depth, limit, wanted


class Backlogged(QueueFull):
    """Admission by cost: a request larger than a batch, refused while the work already queued
    would take longer than the server's deadline (MAX_QUEUE_MS) at the measured rate. Small
    requests are still admitted: they take their turn between the windows of large ones."""

    reason = "backlog"

    def __init__(self, backlog_s: float, deadline_s: float, tokens: int):
        BatcherError.__init__(
            self,
            f"the work queued would take about {backlog_s:.1f} s, longer than MAX_QUEUE_MS "
            f"({deadline_s:g} s), and this request needs {tokens} tokens",
        )
        self.depth, self.limit, self.wanted = 0, 0, 0


class TooLarge(BatcherError):
    """One submission needs more work items than the whole queue holds; retrying cannot help."""

    reason = "too_large"

    def __init__(self, wanted: int, limit: int):
        super().__init__(f"request needs {wanted} work items but the queue holds at most {limit}")
        self.wanted, self.limit = wanted, limit


class BatcherClosed(BatcherError):
    reason = "shutting_down"

    def __init__(self) -> None:
        super().__init__("the model is shutting down")


class DeadlineExceeded(BatcherError):
    """The submission's deadline passed before its items were batched: they were never computed."""

    reason = "expired"

    def __init__(self, timeout_ms: float | None, waited_s: float):
        budget = f"timeout_ms={timeout_ms:g}" if timeout_ms is not None else "deadline"
        super().__init__(
            f"deadline exceeded: the request's {budget} passed after {waited_s * 1000:.0f} ms, before the "
            "model computed it; it was dropped from the queue"
        )
        self.timeout_ms, self.waited_s = timeout_ms, waited_s


class QueueTimedOut(DeadlineExceeded):
    """The server's own deadline (MAX_QUEUE_MS) passed while the request's work was queued: the
    server could not start it in time, so it refuses it (retry later) rather than answer late."""

    def __init__(self, timeout_ms: float | None, waited_s: float):
        BatcherError.__init__(
            self,
            f"the server could not start this request's work within {timeout_ms:g} ms (MAX_QUEUE_MS; "
            f"it waited {waited_s * 1000:.0f} ms): it was dropped uncomputed",
        )
        self.timeout_ms, self.waited_s = timeout_ms, waited_s


class BatchFailed(BatcherError, RuntimeError):
    """The model raised on a batch. Each of its items gets its own instance (the model's error as
    the cause): one exception object re-raised by many requests would pile up their tracebacks."""

    def __init__(self, batch_id: int, error: BaseException):
        super().__init__(f"inference failed for batch {batch_id}: {error}")
        self.batch_id = batch_id
        self.__cause__ = error


class BatchObserver(Protocol):
    def on_batch(self, items: int, rows: int, padded_tokens: int) -> None: ...
    def on_queue_depth(self, depth: int) -> None: ...
    def on_rejected(self, reason: str, count: int) -> None: ...  # submissions refused, or items dropped


class _NullObserver:
    def on_batch(self, items: int, rows: int, padded_tokens: int) -> None:
        pass

    def on_queue_depth(self, depth: int) -> None:
        pass

    def on_rejected(self, reason: str, count: int) -> None:
        pass


class Priority(IntEnum):
    HIGH = 0  # lower first, as in Triton
    NORMAL = 1


_request_ids = itertools.count(1)


@dataclass(eq=False)
class Schedule:
    """One request's deadline and priority, shared by all its submissions (a V2 batch makes several)."""

    priority: Priority = Priority.NORMAL
    deadline: float | None = None  # on the batcher's clock (time.perf_counter)
    timeout_ms: float | None = None  # what the client asked for, for the error message
    started: float = 0.0
    expired: bool = False  # counted once, however many of its items are dropped
    request_id: int = field(default_factory=lambda: next(_request_ids))

    def remaining_ms(self) -> float | None:
        """What is left of the deadline, in milliseconds (a clock every process reads alike)."""
        return None if self.deadline is None else (self.deadline - time.perf_counter()) * 1000.0

    server: bool = False  # the deadline is the server's (MAX_QUEUE_MS), not the client's timeout_ms
    taken: int = 0  # its items batched so far: requests take turns at anchoring batches (fairness)
    # The batchers' timers for its deadline, cancelled once it is answered (app/engine/client.py):
    # an answered request leaves nothing in the event loop's timer heap.
    timers: list[asyncio.TimerHandle] = field(default_factory=list, repr=False)

    @classmethod
    def within(
        cls, timeout_ms: float | None, priority: Priority = Priority.NORMAL, server: bool = False
    ) -> Schedule:
        now = time.perf_counter()
        deadline = None if timeout_ms is None else now + timeout_ms / 1000.0
        return cls(priority=priority, deadline=deadline, timeout_ms=timeout_ms, started=now, server=server)

    def due(self, now: float) -> bool:
        """Its deadline has passed: the client's at any time, the server's (a bound on the wait
        before a request starts) only while none of its items has been batched."""
        return self.deadline is not None and self.deadline <= now and not (self.server and self.taken)

    def expired_error(self, now: float) -> DeadlineExceeded:
        kind = QueueTimedOut if self.server else DeadlineExceeded
        return kind(self.timeout_ms, now - self.started)


@dataclass
class WorkItem:
    payload: Any  # handed to `collate`, e.g. an Encoding or a list of Encodings
    length: int  # tokens in the item's longest sequence
    rows: int = 1  # sequences in the item (choices for multiple choice)
    shape_key: Hashable = None  # only items with equal keys share a batch (e.g. number of choices)
    future: asyncio.Future | None = field(default=None, repr=False)
    enqueued_at: float = 0.0
    schedule: Schedule = field(default_factory=Schedule, repr=False)


def padded_tokens(items: Sequence[WorkItem]) -> int:
    """What a batch of `items` costs: its longest sequence times its rows."""
    return max(it.length for it in items) * sum(it.rows for it in items)


# What each item's future resolves to: the reply's item itself (its outputs, queue and inference
# seconds, batch), made once.
ItemResult = ItemOutput


class ComputeSlots:
    """The device's batch slots, shared by every model's batcher: a batch runs only while it holds
    one. `held` tells a batcher whether other models are computing (then no batch runs alone)."""

    def __init__(self, slots: int):
        self._semaphore = asyncio.Semaphore(slots)
        self.slots, self.held = slots, 0

    def locked(self) -> bool:
        return self._semaphore.locked()

    async def acquire(self) -> None:
        await self._semaphore.acquire()
        self.held += 1

    def release(self) -> None:
        self.held -= 1
        self._semaphore.release()
