"""SPLADE's sparse vectors: the graph answers each sequence's weights over the vocabulary
(model.bert.splade); here they become TEI's [{index, value}] lists. Torch-free."""

from __future__ import annotations

import numpy as np


def nonzero_weights(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[vocab] weights -> (indices, values) of the nonzero ones, by increasing index."""
    weights = np.asarray(weights, dtype=np.float32)
    indices = np.flatnonzero(weights > 0)
    return indices, weights[indices]


def as_pairs(weights: np.ndarray) -> list[dict[str, float | int]]:
    """TEI's /embed_sparse entry for one text: [{"index": i, "value": w}] for each w > 0."""
    indices, values = nonzero_weights(weights)
    return [
        {"index": int(i), "value": float(v)} for i, v in zip(indices.tolist(), values.tolist(), strict=True)
    ]
