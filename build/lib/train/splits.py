"""Which examples train and which validate: one definition for training, offline evaluation and
evaluation of a live service (torch-free, so the HTTP evaluator needs no torch).

Held-out slices are honest: whole articles/passages/documents (`split_by_group`), or, for data
such as SST-2 whose training file holds every sentence together with its sub-phrases, whole
texts with every phrase of a held-out text dropped from training (`split_whole_texts`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .readers import read_examples
from .squad_sentences import sample_negatives

HOLDOUTS = ("group", "whole-texts")


@dataclass
class DataOptions:
    """The data options of `python -m train` that decide which examples are read and held out."""

    task: str
    train: Path
    validation: Path | None = None
    validation_fraction: float = 0.0
    holdout: str = "group"
    seed: int = 42
    format: str = "auto"
    text_column: str | None = None
    pair_column: str | None = None
    label_column: str | None = None
    limit_train: int | None = None
    limit_eval: int | None = None
    negatives: int | None = None


def read_file(options: DataOptions, path: Path, fmt: str | None = None) -> list:
    columns = {}
    if options.task == "classify":
        columns = {
            "text_column": options.text_column,
            "pair_column": options.pair_column,
            "label_column": options.label_column,
        }
    return read_examples(options.task, path, fmt or options.format, **columns)


def split_examples(options: DataOptions) -> tuple[list, list]:
    """(train, validation) examples, as training reads and holds them out."""
    train = read_file(options, options.train)
    if options.validation:
        valid = read_file(options, options.validation)
    elif options.validation_fraction:
        split = split_whole_texts if options.holdout == "whole-texts" else split_by_group
        train, valid = split(train, options.validation_fraction, options.seed)
    else:
        valid = []
    if options.negatives is not None:
        train = sample_negatives(train, options.negatives, options.seed)
    train = subsample(train, options.limit_train, options.seed)
    return train, subsample(valid, options.limit_eval, options.seed)


def split_by_group(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """Hold out whole groups (articles, passages, documents) of about `fraction` of the examples."""
    check_fraction(fraction)
    groups = list(dict.fromkeys(e.group for e in examples))
    if len(groups) < 2:
        raise ValueError("cannot hold out a validation slice: the data has a single article/group")
    random.Random(seed).shuffle(groups)
    target, held, count = fraction * len(examples), set(), 0
    sizes: dict[str, int] = {}
    for e in examples:
        sizes[e.group] = sizes.get(e.group, 0) + 1
    for g in groups[:-1]:
        if count >= target:
            break
        held.add(g)
        count += sizes[g]
    return [e for e in examples if e.group not in held], [e for e in examples if e.group in held]


def split_whole_texts(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """Hold out `fraction` of the whole texts (those that occur inside no other example's text, on
    word boundaries), and drop from training every example whose text occurs inside a held-out
    text: SST-2's training file holds each sentence and its sub-phrases, so a random row split
    validates on phrases the model was trained on."""
    check_fraction(fraction)
    texts = {" ".join(e.text.split()) for e in examples}
    inside_others: set[str] = set()
    for text in texts:
        tokens = text.split()
        n = len(tokens)
        for i in range(n):
            for j in range(i + 1, n + 1):
                if j - i < n and (phrase := " ".join(tokens[i:j])) in texts:
                    inside_others.add(phrase)
    whole = sorted({e.text for e in examples if " ".join(e.text.split()) not in inside_others})
    if len(whole) < 2:
        raise ValueError("cannot hold out whole texts: every text occurs inside another")
    random.Random(seed).shuffle(whole)
    held = set(whole[: max(1, round(fraction * len(whole)))])
    held_phrases: set[str] = set()
    for text in held:
        tokens = text.split()
        held_phrases.update(
            " ".join(tokens[i:j]) for i in range(len(tokens)) for j in range(i + 1, len(tokens) + 1)
        )
    valid, train, seen = [], [], set()
    for e in examples:
        if e.text in held:
            if e.text not in seen:  # a held-out sentence listed twice is validated once
                valid.append(e)
                seen.add(e.text)
        elif " ".join(e.text.split()) not in held_phrases:
            train.append(e)
    return train, valid


def check_fraction(fraction: float) -> None:
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must be between 0 and 1, got {fraction}")


def subsample(examples: list, limit: int | None, seed: int) -> list:
    if not limit or limit >= len(examples):
        return examples
    keep = sorted(np.random.default_rng(seed).permutation(len(examples))[:limit].tolist())
    return [examples[i] for i in keep]
