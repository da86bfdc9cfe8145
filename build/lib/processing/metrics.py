"""Evaluation metrics with their standard definitions (numpy only, no torch).

- classification: accuracy, F1 (binary on label 1, or macro), Pearson/Spearman for regression;
- NER: entity-level precision/recall/F1 with seqeval's default (conlleval) chunking, which reads
  IOB1 and IOB2 (and IOBES) tags;
- SQuAD: exact match and F1 with the official normalisation, max over the gold answers; an empty
  gold list (SQuAD v2 "no answer") only matches an empty prediction, as in evaluate-v2.0.py.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

# ----------------------------------------------------------------------------- classification


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape:
        raise ValueError(f"{predictions.shape[0]} predictions for {labels.shape[0]} labels")
    return float((predictions == labels).mean()) if len(labels) else 0.0


def f1_score(predictions: Sequence[int], labels: Sequence[int], num_labels: int | None = None) -> float:
    """Binary F1 of class 1 when there are two classes, else the macro average over classes."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if num_labels is None:
        num_labels = int(max(predictions.max(initial=0), labels.max(initial=0))) + 1
    classes = [1] if num_labels == 2 else list(range(num_labels))
    scores = []
    for c in classes:
        tp = int(((predictions == c) & (labels == c)).sum())
        fp = int(((predictions == c) & (labels != c)).sum())
        fn = int(((predictions != c) & (labels == c)).sum())
        scores.append(_f1(tp, tp + fp, tp + fn))
    return float(np.mean(scores)) if scores else 0.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError(f"{len(x)} predictions for {len(y)} labels")
    dx, dy = x - x.mean(), y - y.mean()
    denom = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denom) if denom > 0 else 0.0


def rankdata(x: Sequence[float]) -> np.ndarray:
    """1-based ranks; ties share their average rank (scipy's default)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return pearson(rankdata(x), rankdata(y))


def _f1(correct: int, predicted: int, gold: int) -> float:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


# ----------------------------------------------------------------------------- NER (seqeval semantics)


def _split_tag(tag: str) -> tuple[str, str]:
    prefix = tag[0] if tag else "O"
    kind = tag[1:].split("-", maxsplit=1)[-1] or "_"
    return prefix, kind


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag not in ("O", ".") and prev_type != kind


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != kind


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, first, last) chunks, inclusive, exactly as seqeval's default mode finds them.

    An I- tag after O or after another type opens a chunk, so IOB1 and IOB2 both work.
    """
    chunks = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, kind = _split_tag(tag)
        if _end_of_chunk(prev_tag, prefix, prev_type, kind):
            chunks.append((prev_type, begin, i - 1))
        if _start_of_chunk(prev_tag, prefix, prev_type, kind):
            begin = i
        prev_tag, prev_type = prefix, kind
    return chunks


def entity_scores(gold: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]) -> dict[str, float]:
    """Micro precision/recall/F1 over entities of all sentences, plus per-type F1."""
    gold_set: set[tuple[int, str, int, int]] = set()
    pred_set: set[tuple[int, str, int, int]] = set()
    for n, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: {len(g)} gold tags but {len(p)} predicted")
        gold_set.update((n, *e) for e in get_entities(g))
        pred_set.update((n, *e) for e in get_entities(p))
    return span_scores(gold_set, pred_set)


def span_scores(
    gold: set[tuple[int, str, int, int]], predicted: set[tuple[int, str, int, int]]
) -> dict[str, float]:
    """Exact-match scores of (sentence, type, start, end) entities: word indices from tags, or
    character offsets from a service's answers (the same entities when they fall on words)."""
    correct = len(gold & predicted)
    precision = correct / len(predicted) if predicted else 0.0
    recall = correct / len(gold) if gold else 0.0
    result = {"precision": precision, "recall": recall, "f1": _f1(correct, len(predicted), len(gold))}
    for kind in sorted({e[1] for e in gold | predicted}):
        g = {e for e in gold if e[1] == kind}
        p = {e for e in predicted if e[1] == kind}
        result[f"f1_{kind}"] = _f1(len(g & p), len(p), len(g))
    return result


# ----------------------------------------------------------------------------- SQuAD

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace (official script)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict[str, float]:
    """EM and F1 in percent, as the official scripts report them; each question takes its best gold.

    A question with an empty gold list is unanswerable: only the empty prediction scores.
    A question without a prediction counts as wrong.
    """
    if not gold:
        return {"exact_match": 0.0, "f1": 0.0}
    em_total = f1_total = 0.0
    for qid, answers in gold.items():
        answers = [a for a in answers if normalize_answer(a)] or [""]
        prediction = predictions.get(qid)
        if prediction is None:
            continue
        em_total += max(exact_match(prediction, a) for a in answers)
        f1_total += max(token_f1(prediction, a) for a in answers)
    return {"exact_match": 100.0 * em_total / len(gold), "f1": 100.0 * f1_total / len(gold)}


def ranking_scores(rankings: Iterable[tuple[Sequence[float], int]]) -> dict[str, float]:
    """P@1 and MRR of (candidate scores, index of the one relevant candidate) per query. Tied
    scores count as a random order among them (the expected value), so a method that cannot
    tell candidates apart gets no credit for where they happen to be listed."""
    p1, rr, n = 0.0, 0.0, 0
    for scores, relevant in rankings:
        s = np.asarray(scores, dtype=np.float64)
        higher = int((s > s[relevant]).sum())
        tied = int((s == s[relevant]).sum())  # the relevant one included
        p1 += 1.0 / tied if higher == 0 else 0.0
        rr += float(np.mean(1.0 / (higher + 1 + np.arange(tied))))
        n += 1
    if not n:
        raise ValueError("no queries to score")
    return {"p@1": p1 / n, "mrr": rr / n, "queries": n}
