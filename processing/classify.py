"""Sequence classification: encoding (with sliding windows for long texts) and scores."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .padding import softmax
from .tokenizer import Encoding, TextTokenizer, window_spans

AGGREGATIONS = ("mean", "max", "first")


@dataclass
class LabelScore:
    label: str
    score: float


@dataclass
class ClassifyResult:
    label: str
    score: float
    scores: list[LabelScore]
    value: float | None = None  # regression output
    windows: int = 1


def encode_for_classify(
    tokenizer: TextTokenizer,
    text: str,
    text_pair: str | None = None,
    max_seq_len: int = 128,
    long_text: str = "truncate",
    window_overlap: int = 32,
) -> list[Encoding]:
    """One encoding, or (long_text="windows", single text) one per overlapping window (book §8.5.2)."""
    if long_text == "truncate" or text_pair is not None:
        return [tokenizer.encode(text, text_pair, max_length=max_seq_len)]
    if long_text != "windows":
        raise ValueError(f"long_text must be 'truncate' or 'windows', got {long_text!r}")
    tokens = tokenizer.tokenize(text)
    capacity = max_seq_len - tokenizer.n_special()
    return [
        tokenizer.build(tokens.slice(s, e)) for s, e in window_spans(len(tokens), capacity, window_overlap)
    ]


def classify_from_logits(
    logits: np.ndarray,
    labels: list[str],
    regression: bool = False,
    aggregation: str = "mean",
    top_k: int | None = None,
) -> ClassifyResult:
    """`logits` is [windows, labels] for one document; windows are aggregated by `aggregation`."""
    logits = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if regression:
        values = logits[:, 0]
        value = float(
            values[0] if aggregation == "first" else values.max() if aggregation == "max" else values.mean()
        )
        name = labels[0] if labels else "value"
        return ClassifyResult(name, value, [LabelScore(name, value)], value=value, windows=len(logits))
    if len(logits) == 1 or aggregation == "first":
        doc = softmax_list(logits[0].tolist())  # the common case: plain floats beat numpy's call overhead
    else:
        probs = softmax(logits, axis=-1)
        rows = probs.max(axis=0) if aggregation == "max" else probs.mean(axis=0)
        doc = (rows / rows.sum()).tolist()
    order = sorted(range(len(doc)), key=lambda i: -doc[i])  # stable: ties keep label order
    if top_k is not None:
        order = order[:top_k]
    scores = [LabelScore(labels[i], doc[i]) for i in order]
    return ClassifyResult(scores[0].label, scores[0].score, scores, windows=len(logits))


def softmax_list(values: list[float]) -> list[float]:
    peak = max(values)
    exps = [math.exp(v - peak) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


# Two-label pair models (rerankers, NLI, paraphrase): the class that means "relevant". A label of
# one of these names wins wherever it sits (GLUE's RTE and QNLI put "entailment" first); else index
# 1, the positive class of a binary classifier by convention.
RELEVANT_LABELS = frozenset(
    {"relevant", "entailment", "1", "true", "yes", "positive", "duplicate", "equivalent"}
)


def positive_label(labels: list[str]) -> int:
    named = [i for i, label in enumerate(labels) if label.lower() in RELEVANT_LABELS]
    return named[0] if len(named) == 1 else 1


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)  # no overflow for very negative logits
    return e / (1.0 + e)


def label_logits(logits: np.ndarray, labels: list[str]) -> list[LabelScore]:
    """Each label's logit (averaged over windows), best first: TEI's raw_scores."""
    mean = np.atleast_2d(np.asarray(logits, dtype=np.float64)).mean(axis=0).tolist()
    order = sorted(range(len(mean)), key=lambda i: -mean[i])
    return [LabelScore(labels[i], mean[i]) for i in order]


def relevance(result: ClassifyResult, logits: np.ndarray, labels: list[str], raw: bool = False) -> float:
    """A pair's relevance from its classification: a one-output model's sigmoid of its value (raw: the
    value); a two-label model's probability of its positive label, exactly as `result` scores it (raw:
    that label's logit, averaged over windows)."""
    if result.value is not None:
        return result.value if raw else sigmoid(result.value)
    positive = positive_label(labels)
    if raw:
        return float(np.atleast_2d(np.asarray(logits, dtype=np.float64))[:, positive].mean())
    return next(s.score for s in result.scores if s.label == labels[positive])
