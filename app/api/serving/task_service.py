"""What every task service shares: the request's stage timings, the service base class (service
limits, the window overlap the model was trained with, submitting work under the request's
schedule) and the rule for when a CPU step leaves the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from app.engine.batch_types import Schedule
from app.engine.protocol import EngineClient, EngineRequest, Item, ItemOutput
from app.errors import TextTooLong, TooManyInputs
from app.observe.metrics import Metrics
from app.settings import Settings
from processing.tokenizer import Encoding, default_window_overlap

if TYPE_CHECKING:
    from export.bundle import BundleManifest
    from processing.tokenizer import TextTokenizer

T = TypeVar("T")


class ModelVersion(Protocol):
    """What a service is made from: one loaded version of a model (app/engine/loader.Bundle)."""

    name: str
    version: str
    task: str | None
    manifest: BundleManifest | None
    tokenizer: TextTokenizer | None
    service: TaskService | None


class Timings:
    """One request through the service: its schedule (deadline, priority; None = no deadline, normal),
    its seconds per stage (bert_stage_seconds) and what happened to its inputs, as plain facts:
    the protocol adapters write the headers (Server-Timing, TEI's, X-Truncated-Inputs)."""

    def __init__(self, schedule: Schedule | None = None) -> None:
        self.schedule = schedule
        self.stages: dict[str, float] = {}
        self.started = time.perf_counter()
        self.chars = 0  # characters of the request's texts
        self.tokens = 0  # tokens of its work items (a choice group: each choice at the group's longest)
        self.truncated: list[int] = []  # indices of the inputs cut to max_seq_len (bare-list answers)
        self.windows: dict[int, int] = {}  # index -> windows, for inputs read in several windows

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + max(0.0, seconds)

    @contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - started)

    def observe(self, metrics: Metrics, task: str, model: str) -> None:
        for stage, seconds in self.stages.items():
            metrics.child(metrics.stage, stage, task, model).observe(seconds)
        if self.tokens:
            metrics.child(metrics.request_tokens, task, model).observe(self.tokens)


# Below this many characters, tokenizing (tens of microseconds in the Rust tokenizer) costs less
# than handing the work to a thread and back; longer inputs go to a thread to keep the loop free.
INLINE_CHARS = 2_000


async def cpu_step(chars: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a CPU-bound pre/post-processing step on an input of `chars` characters."""
    if chars <= INLINE_CHARS:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def check_chars(value: str, limit: int, field: str, setting: str) -> None:
    if len(value) > limit:
        raise TextTooLong(f"{field} has {len(value)} characters; the limit is {limit} ({setting})", field)


def check_items(count: int, limit: int, field: str, what: str = "items") -> None:
    """A request's list of `count` inputs against MAX_BATCH_ITEMS (`limit`)."""
    if count > limit:
        raise TooManyInputs(f"{field} has {count} {what}; the limit is {limit} (MAX_BATCH_ITEMS)", field)


class TaskService:
    task = ""

    def __init__(self, bundle: ModelVersion, settings: Settings, engine: EngineClient):
        assert bundle.manifest is not None and bundle.tokenizer is not None
        self.bundle = bundle
        self.manifest = bundle.manifest
        self.tokenizer = bundle.tokenizer
        self.engine = engine
        self.settings = settings
        self.max_seq_len = self.manifest.max_seq_len
        # The overlap the model was trained with, unless WINDOW_OVERLAP overrides it; windows must
        # advance, so it stays below half a window.
        overlap = settings.window_overlap
        if overlap is None:
            overlap = self.manifest.preprocessing.get("window_overlap")
        if overlap is None:
            overlap = default_window_overlap(self.max_seq_len)
        self.window_overlap = min(overlap, (self.max_seq_len - 2) // 2)

    async def infer(
        self, items: list[Item], timings: Timings, grouped: bool = False, reduce: str | None = None
    ) -> list[ItemOutput]:
        """The items through the engine under the request's schedule (raises QueueFull / TooLarge /
        BatcherClosed / DeadlineExceeded at once); cancelled, the engine drops what is queued."""
        schedule = timings.schedule or Schedule()
        request = EngineRequest(
            request_id=schedule.request_id,
            model=self.bundle.name,
            version=self.bundle.version,
            items=items,
            deadline_ms=schedule.remaining_ms(),
            timeout_ms=schedule.timeout_ms,
            server_deadline=schedule.server,
            priority=int(schedule.priority),
            grouped=grouped,
            reduce=reduce,
        )
        timings.tokens += sum(item.length * item.rows for item in items)
        started = time.perf_counter()
        results = (await self.engine.infer(request, schedule)).items
        waited = time.perf_counter() - started
        # Several batches may serve one request: model time is the sum over distinct batches.
        inference = sum({r.batch_id: r.inference_s for r in results}.values())
        inference = min(inference, waited)
        timings.add("inference", inference)
        timings.add("queue", waited - inference)
        return results


def sequence_items(encodings: Sequence[Encoding]) -> list[Item]:
    """One work item per sequence."""
    return [Item.of([e]) for e in encodings]
