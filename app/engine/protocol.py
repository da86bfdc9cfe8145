"""The messages between the front end and the engine: plain typed structs of numpy buffers and
scalars, nothing of HTTP and nothing that means something in one process only.

In: a request id, the model and version, int32 token-id and type-id rows per work item (a sequence,
a QA/NER window, or a choice group), the remaining milliseconds of its deadline, its priority and
what to reduce the outputs to. Out: per item, its rows of the model's outputs (logits, start/end
logits, or a pooled vector), with the queue and inference seconds; or a typed error of app.errors,
whose `reason` is the code the front end maps to a status (app/api/error_table.py). A front end
that loses its client aborts (EngineClient.abort).

Dataclasses of numpy arrays, not msgspec: in one process nothing is encoded at all, and the token
rows are already the arrays the engine pads (docs/performance.md §6 for the cost of each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Tokens(Protocol):
    input_ids: Sequence[int]
    token_type_ids: Sequence[int]


@dataclass(frozen=True)
class Item:
    """One work item: `rows` sequences batched together (more than one only for a choice group)."""

    input_ids: np.ndarray  # int32 [rows, length], each row's tail past its length is 0
    token_type_ids: np.ndarray  # int32 [rows, length]
    lengths: np.ndarray  # int32 [rows]: each row's real tokens

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def length(self) -> int:
        """Its longest row's tokens: the width `of` gives the rows (a shape, not a reduction)."""
        return self.input_ids.shape[1]

    @classmethod
    def of(cls, sequences: Sequence[Tokens]) -> Item:
        """The rows of `sequences` (encodings), zero-filled to the longest."""
        if len(sequences) == 1:  # a sequence: its own arrays, one conversion each
            (s,) = sequences
            ids = np.asarray(s.input_ids, dtype=np.int32).reshape(1, -1)  # [1, length]
            types = np.asarray(s.token_type_ids, dtype=np.int32).reshape(1, -1)
            return cls(ids, types, np.array([ids.shape[1]], dtype=np.int32))
        lengths = np.fromiter((len(s.input_ids) for s in sequences), dtype=np.int32, count=len(sequences))
        ids = np.zeros((len(sequences), int(lengths.max())), dtype=np.int32)  # [rows, length]
        types = np.zeros_like(ids)
        for row, s in enumerate(sequences):
            ids[row, : lengths[row]] = s.input_ids
            types[row, : lengths[row]] = s.token_type_ids
        return cls(ids, types, lengths)


REDUCTIONS = ("mean", "cls", "max")  # pooling of last_hidden_state over each row's own tokens


@dataclass(frozen=True)
class EngineRequest:
    request_id: int
    model: str
    version: str
    items: list[Item]
    deadline_ms: float | None = None  # what is left of the request's deadline when sent; None: none
    timeout_ms: float | None = None  # what the client asked for (for the error message)
    server_deadline: bool = False  # the deadline is MAX_QUEUE_MS's (a bound on queueing), not the client's
    priority: int = 1  # 0 high, 1 normal (app.engine.batch_types.Priority)
    grouped: bool = False  # items are choice groups: [items, choices, sequence], equal choices per batch
    reduce: str | None = None  # one of REDUCTIONS: each row's pooled vector replaces its hidden states


@dataclass(frozen=True)
class ItemOutput:
    outputs: dict[str, np.ndarray]  # this item's rows of every output ("pooled": [rows, hidden])
    queue_s: float
    inference_s: float
    batch_id: int
    batch_size: int


@dataclass(frozen=True)
class EngineReply:
    request_id: int
    items: list[ItemOutput]


class EngineClient(Protocol):
    """The engine as the front end sees it: app/engine/client.Engine in this process, which takes the
    front end's own `schedule` (app.engine.batch_types.Schedule) rather than make it again from the
    request's fields; app/api/remote.RemoteEngine across processes, which sends only the fields."""

    async def infer(self, request: EngineRequest, schedule: Any = None) -> EngineReply: ...
