"""The process's own memory, beside the sessions': glibc's mmap threshold, and the cyclic collector
once start-up is done (docs/decisions.md, ort_memory; docs/performance.md)."""

from __future__ import annotations

import ctypes
import gc
import sys

M_MMAP_THRESHOLD = -3  # mallopt parameter, from glibc's malloc.h

YOUNG_OBJECTS = 7000  # allocations before a young collection (settle_heap)


def fix_malloc_mmap_threshold(nbytes: int) -> bool:
    """Serve every allocation of `nbytes` or more with mmap, so it returns to the OS when freed.

    glibc raises its mmap threshold after the first large free; from then on the buffers of each
    new (batch, length) shape come from the heap, which fragments and keeps growing (see
    docs/decisions.md, ort_memory). Fixing the threshold stops that. glibc only; returns whether it applied.
    """
    if nbytes <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, nbytes))
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False


def settle_heap() -> None:
    """Once startup's loads are done: what is alive now (the app, its schemas, the models' Python
    side) lives as long as the process, so it leaves the cyclic collector's sight (`gc.freeze`), and
    the young generation may hold 10x CPython's default of 700 objects. A request's objects die by
    reference count (no cycles), but 32 requests in flight fill 700 and trigger collections that
    find nothing: /embed spent 0.04-0.06 ms of the event loop per request in them (docs/performance.md)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, middle, old)
