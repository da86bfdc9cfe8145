"""A request's deadline and priority, from wherever the client put them, into the batcher's Schedule.

Every inference request may carry `timeout_ms` (its whole budget, counted from when its body has
been read) and `priority` (`high` or `normal`): as body fields (native_schemas.Request), as V2 request
parameters (also Triton's schedule-policy `priority` levels and `timeout` in microseconds), or as
the headers below, which work for every route whatever its body. A field wins over a header. The
batcher (app/engine/batcher.py) applies the Schedule: queue policy, no HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.engine.batch_types import Priority, Schedule
from app.errors import InvalidInput

TIMEOUT_HEADER = "X-Timeout-Ms"
PRIORITY_HEADER = "X-Priority"
PRIORITIES = {"high": Priority.HIGH, "normal": Priority.NORMAL}
MAX_TIMEOUT_MS = 3_600_000  # an hour: anything longer is a mistake, not a deadline


def timeout_ms_of(value: object, where: str) -> float:
    """A positive number of milliseconds, at most MAX_TIMEOUT_MS (a header's text, or a JSON number)."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT_MS:
        raise InvalidInput(f"{where} must be a number of milliseconds in (0, {MAX_TIMEOUT_MS}]", where)
    return float(value)


def priority_of(value: object, where: str) -> Priority:
    if isinstance(value, str) and value.strip().lower() in PRIORITIES:
        return PRIORITIES[value.strip().lower()]
    raise InvalidInput(f"{where} must be one of {', '.join(PRIORITIES)}", where)


def schedule_for(
    headers: Mapping[str, str],
    timeout_ms: float | None = None,
    priority: str | Priority | None = None,
    max_queue_ms: float = 0.0,
) -> Schedule:
    """The Schedule of a request, from now: its fields where given, else its headers. Without a
    timeout of the client's, the server's own (MAX_QUEUE_MS; 0 = none): work still queued then is
    refused with 503 and Retry-After, never left waiting for a client that gave up."""
    if timeout_ms is None and TIMEOUT_HEADER in headers:
        timeout_ms = timeout_ms_of(headers[TIMEOUT_HEADER], TIMEOUT_HEADER)
    if priority is None:
        priority = headers.get(PRIORITY_HEADER, "normal")
    level = priority if isinstance(priority, Priority) else priority_of(priority, PRIORITY_HEADER)
    if timeout_ms is None and max_queue_ms > 0:
        return Schedule.within(max_queue_ms, level, server=True)
    return Schedule.within(timeout_ms, level)
