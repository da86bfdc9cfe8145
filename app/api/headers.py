"""The response headers a request's Timings turn into, written by the routes (the protocol
adapters) from plain facts the services record: Server-Timing, text-embeddings-inference's timing
headers, and what happened to long inputs (for answers that are bare lists, as TEI's are)."""

from __future__ import annotations

import time

from app.api.serving.task_service import Timings

TEI_HEADERS = (
    "x-compute-time",
    "x-compute-characters",
    "x-compute-tokens",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
)

_TEI_RAW = tuple(name.encode() for name in TEI_HEADERS)


def timing_headers(timings: Timings, tei: bool) -> list[tuple[bytes, bytes]]:
    """Server-Timing and, with `tei`, text-embeddings-inference's timing headers, as raw ASGI
    header pairs (appended to the response at once). TEI's are whole milliseconds (truncated, as
    TEI's are); compute and total time run from when the route began serving the parsed request."""
    timing = ", ".join(f"{stage};dur={seconds * 1000:.2f}" for stage, seconds in timings.stages.items())
    raw = [(b"server-timing", timing.encode("latin-1"))]
    if tei:
        total = int((time.perf_counter() - timings.started) * 1000)
        ms = [int(timings.stages.get(stage, 0.0) * 1000) for stage in ("tokenize", "queue", "inference")]
        values = (total, timings.chars, timings.tokens, total, *ms)
        raw += [(name, str(value).encode()) for name, value in zip(_TEI_RAW, values, strict=True)]
    return raw


def long_input_headers(timings: Timings) -> dict[str, str]:
    """The indices of the inputs cut to max_seq_len, and of those read in several windows with their
    count."""
    headers = {}
    if timings.truncated:
        headers["X-Truncated-Inputs"] = ",".join(map(str, timings.truncated))
    if timings.windows:
        headers["X-Windowed-Inputs"] = ",".join(f"{i}={n}" for i, n in timings.windows.items())
    return headers
