"""The engine as the front end sees it: `infer` an EngineRequest, get an EngineReply or a typed error
(app.errors; its `reason` is the code app/api/error_table.py maps to a status). A cancelled `infer`
(the client went away) aborts: the request's queued items are dropped, never computed.

`Engine` serves in this process: the batchers of the versions in service, by model and version
(ModelControl adds a version before it swaps it in, and removes it once retired).
"""

from __future__ import annotations

import asyncio

from app.engine.batch_types import Priority, Schedule, WorkItem
from app.engine.batcher import Batcher
from app.engine.protocol import EngineReply, EngineRequest, ItemOutput
from app.engine.reduce import Work
from app.errors import ModelUnavailable


class Engine:
    def __init__(self) -> None:
        self._batchers: dict[tuple[str, str], Batcher] = {}
        # One schedule per request id while any of its submissions is open: a request answered in
        # several submissions (a V2 batch's rows) expires once, and is counted once.
        self._schedules: dict[int, tuple[Schedule, int]] = {}

    def add(self, model: str, version: str, batcher: Batcher) -> None:
        self._batchers[model, version] = batcher

    def remove(self, model: str, version: str) -> None:
        self._batchers.pop((model, version), None)

    def _open(self, request: EngineRequest, schedule: Schedule | None) -> Schedule:
        known, refs = self._schedules.get(request.request_id, (None, 0))
        if known is not None:
            schedule = known
        elif schedule is None:  # from another process: its deadline again, from what was left of it
            schedule = Schedule.within(
                request.deadline_ms, Priority(request.priority), server=request.server_deadline
            )
            schedule.request_id = request.request_id
            if request.timeout_ms is not None and request.deadline_ms is not None:
                # The client's budget began before the engine heard of it (for the error's message).
                schedule.timeout_ms = request.timeout_ms
                schedule.started -= (request.timeout_ms - request.deadline_ms) / 1000.0
        self._schedules[request.request_id] = (schedule, refs + 1)
        return schedule

    def _close(self, request_id: int) -> None:
        schedule, refs = self._schedules[request_id]
        if refs > 1:
            self._schedules[request_id] = (schedule, refs - 1)
            return
        del self._schedules[request_id]
        for timer in schedule.timers:  # answered: its deadline has nothing left to drop
            timer.cancel()

    async def infer(self, request: EngineRequest, schedule: Schedule | None = None) -> EngineReply:
        """`schedule`: the front end's own, when it runs in this process (the same deadline and
        priority as the request's fields, not made again)."""
        batcher = self._batchers.get((request.model, request.version))
        if batcher is None:
            raise ModelUnavailable(f"model {request.model!r} version {request.version!r} is not in service")
        work = [
            WorkItem(
                payload=Work(item, request.reduce),
                length=item.length,
                rows=item.rows,
                shape_key=item.rows if request.grouped else None,
            )
            for item in request.items
        ]
        schedule = self._open(request, schedule)
        try:
            futures = batcher.submit(work, schedule)
            try:
                results = await gather_all(futures)
            finally:
                for future in futures:
                    future.cancel()  # no-op when done; drops queued work when the caller went away
        finally:
            self._close(request.request_id)
        return EngineReply(request.request_id, results)


async def gather_all(futures: list[asyncio.Future]) -> list[ItemOutput]:
    """Wait for every future (so none is left with an unretrieved exception), then raise the first error."""
    results = await asyncio.gather(*futures, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)
