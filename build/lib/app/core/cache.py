"""The response cache (RESPONSE_CACHE_MB): serialized answers of the task routes, least recently
used first out, within a byte budget. No HTTP here: app/http/routes.py (run_leased) asks and fills it.

A key names the model, its version, the route and the request in canonical form, so a new version
never answers from an old one's entries; those are dropped when it is swapped out (app/models/control.py).
Only answers computed in full are stored: a failure raises before anything is put.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from pydantic import BaseModel

from app.observe.metrics import Metrics


@dataclass(frozen=True)
class Key:
    model: str
    version: str
    route: str
    request: str  # the validated request as canonical JSON, without what does not change the answer


@dataclass(frozen=True)
class Entry:
    body: bytes
    headers: tuple[tuple[str, str], ...]  # the route's own headers (what happened to long inputs)

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers)


class ResponseCache:
    def __init__(self, max_bytes: int, metrics: Metrics | None = None):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._metrics = metrics

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        if self._metrics is not None:
            counter = self._metrics.cache_hits if entry is not None else self._metrics.cache_misses
            counter.labels(model=key.model).inc()
        return entry

    def put(self, key: Key, entry: Entry) -> None:
        """Store `entry`, evicting the least recently used until it fits; one larger than the whole
        budget is not stored."""
        size = cost(key, entry)
        if size > self.max_bytes:
            return
        self._remove(key)
        while self.bytes + size > self.max_bytes:
            old, _ = self._entries.popitem(last=False)
            self.bytes -= cost(old, _)
            if self._metrics is not None:
                self._metrics.cache_evictions.labels(model=old.model).inc()
        self._entries[key] = entry
        self.bytes += size
        self._observe()

    def drop_version(self, model: str, version: str) -> int:
        """Forget every answer of one version of a model (retired, or swapped out)."""
        gone = [k for k in self._entries if k.model == model and k.version == version]
        for key in gone:
            self._remove(key)
        self._observe()
        return len(gone)

    def _remove(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= cost(key, entry)

    def _observe(self) -> None:
        if self._metrics is not None:
            self._metrics.cache_bytes.set(self.bytes)


def cost(key: Key, entry: Entry) -> int:
    """The bytes an entry holds: its serialized response and its key's request text."""
    return entry.size + len(key.request)


# Request fields that do not change the answer: the model is in the key by its resolved name.
NOT_THE_ANSWER = {"model", "timeout_ms", "priority", "user"}


def canonical(request: BaseModel) -> str:
    """The validated request as JSON with sorted keys, without the fields that do not change the answer."""
    fields = request.model_dump(mode="json", exclude=NOT_THE_ANSWER & set(type(request).model_fields))
    return json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
