"""Padding encodings into the int64 arrays the model (PyTorch or ONNX) takes."""

from __future__ import annotations

import numpy as np

from .tokenizer import Encoding


def pad_batch(encodings: list[Encoding], pad_id: int = 0, length: int | None = None) -> dict[str, np.ndarray]:
    """[batch, seq] arrays, padded on the right to the longest row (or `length`)."""
    if not encodings:
        raise ValueError("cannot pad an empty batch")
    longest = max(len(e) for e in encodings)
    length = longest if length is None else max(length, longest)
    ids = np.full((len(encodings), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), length), dtype=np.int64)
    types = np.zeros((len(encodings), length), dtype=np.int64)
    for row, enc in enumerate(encodings):
        n = len(enc)
        ids[row, :n] = enc.input_ids
        mask[row, :n] = 1
        types[row, :n] = enc.token_type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def pad_choices(groups: list[list[Encoding]], pad_id: int = 0) -> dict[str, np.ndarray]:
    """[batch, choices, seq] arrays for multiple choice; every group has the same number of choices."""
    n_choices = {len(g) for g in groups}
    if len(n_choices) != 1:
        raise ValueError(f"every example needs the same number of choices, got {sorted(n_choices)}")
    length = max(len(e) for g in groups for e in g)
    flat = pad_batch([e for g in groups for e in g], pad_id, length)
    c = n_choices.pop()
    return {k: v.reshape(len(groups), c, length) for k, v in flat.items()}


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)
