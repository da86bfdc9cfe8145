"""The engine's two ends of a batch: padding the items' int32 rows into the model's int64 inputs,
and cutting the outputs back into each item's rows, pooled where the request asks (so hidden
states never leave the engine). Pooling is processing/embed.py's, over each row's own tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.engine.protocol import Item
from processing.embed import pool_tokens


@dataclass(frozen=True)
class Work:
    """What the batcher carries per work item: its rows, and what its request reduces them to."""

    item: Item
    reduce: str | None = None


def pad_items(items: list[Item], pad_id: int, grouped: bool) -> dict[str, np.ndarray]:
    """[rows, seq] arrays (or [items, choices, seq] when `grouped`), padded on the right to the
    batch's longest row: the arrays processing.padding.pad_batch / pad_choices make."""
    if not items:
        raise ValueError("cannot pad an empty batch")
    length = max(item.length for item in items)
    rows = sum(item.rows for item in items)
    ids = np.full((rows, length), pad_id, dtype=np.int64)  # [rows, seq]
    mask = np.zeros((rows, length), dtype=np.int64)
    types = np.zeros((rows, length), dtype=np.int64)
    row = 0
    for item in items:
        n, end = item.length, row + item.rows
        if item.rows == 1:  # a sequence fills its row's first `n` tokens: no tail to mask
            ids[row, :n] = item.input_ids[0]
            mask[row, :n] = 1
        else:  # a choice group: each row's real tokens only, the rest stays padding
            real = np.arange(n) < item.lengths[:, None]  # [rows, n]
            ids[row:end, :n] = np.where(real, item.input_ids, pad_id)
            mask[row:end, :n] = real
        types[row:end, :n] = item.token_type_ids
        row = end
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if grouped:
        choices = {item.rows for item in items}
        if len(choices) != 1:
            raise ValueError(f"every example needs the same number of choices, got {sorted(choices)}")
        c = choices.pop()
        inputs = {k: v.reshape(len(items), c, length) for k, v in inputs.items()}  # [items, choices, seq]
    return inputs


def split_rows(outputs: dict[str, np.ndarray], work: list[Work]) -> list[dict[str, np.ndarray]]:
    """Each item's part of every output: its row (a choice group's [choices, ...] block). Where its
    request asks to reduce, last_hidden_state [seq, hidden] becomes "pooled" [hidden], pooled over
    the row's own tokens (the padding its batch gave it never counts)."""
    out = []
    for index, w in enumerate(work):
        part = {name: value[index] for name, value in outputs.items()}
        if w.reduce is not None:
            states = part.pop("last_hidden_state")  # [seq, hidden]: a sequence, never a group
            part["pooled"] = pool_tokens(states[: w.item.length], w.reduce)  # [hidden]
        out.append(part)
    return out


def batch_functions(
    pad_id: int, grouped: bool
) -> tuple[
    Callable[[list[Work]], dict[str, np.ndarray]],
    Callable[[dict[str, np.ndarray], list[Work]], list[dict[str, np.ndarray]]],
]:
    """The batcher's collate and split for one model."""
    return (
        lambda work: pad_items([w.item for w in work], pad_id, grouped),
        split_rows,
    )
