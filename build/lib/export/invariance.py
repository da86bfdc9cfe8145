"""Batch invariance: a row's outputs alone against the same row inside a padded batch.

A user who sends the same text twice must get the same answer, whatever else was batched with
it. Torch-free: export checks every variant with it, and the service checks the variant it
loads during warm-up.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .verify import token_level

INVARIANCE_TOLERANCE = 1e-6
Feeds = dict[str, np.ndarray]


def row_alone(feeds: Feeds, i: int) -> Feeds:
    """Row `i` of a right-padded batch on its own, cut to its own length (longest choice for
    multiple choice): what a request alone in its batch runs."""
    length = int(feeds["attention_mask"][i].reshape(-1, feeds["attention_mask"].shape[-1]).sum(-1).max())
    return {name: np.ascontiguousarray(value[i : i + 1, ..., :length]) for name, value in feeds.items()}


def batch_invariance(
    task: str,
    run: Callable[[Feeds], dict[str, np.ndarray]],
    batches: list[Feeds],
    run_alone: Callable[[Feeds], dict[str, np.ndarray]] | None = None,
) -> dict:
    """Worst |difference| between each row run alone (by `run_alone`, default `run`) and inside its
    batch, over right-padded `batches`; token-level outputs (ner, qa) are compared over the row's
    own tokens."""
    run_alone = run_alone or run
    worst, rows = 0.0, 0
    for feeds in batches:
        together = run(feeds)
        for i in range(feeds["input_ids"].shape[0]):
            alone_feeds = row_alone(feeds, i)
            length = alone_feeds["input_ids"].shape[-1]
            alone = run_alone(alone_feeds)
            for name, value in alone.items():
                mine = together[name][i : i + 1]
                mine = mine[:, :length] if token_level(task) else mine
                worst = max(worst, float(np.abs(mine.astype(np.float64) - value).max(initial=0.0)))
            rows += 1
    return {
        "max_abs_diff": worst,
        "rows": rows,
        "tolerance": INVARIANCE_TOLERANCE,
        "invariant": worst <= INVARIANCE_TOLERANCE,
    }
