"""Extractive QA: overlapping context windows, training labels, and n-best answers.

The context is tokenized once and cut into windows of `capacity` tokens that
share `doc_stride` tokens with their neighbour (the `transformers` convention).
The question is never windowed, only truncated to `max_query_len`.

Answer scores are comparable across windows: every candidate span (from every
window) is scored by start+end logit and one softmax runs over all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tokenizer import Encoding, TextTokenizer, Tokens, window_spans


@dataclass
class QAWindow:
    encoding: Encoding
    token_start: int  # index of the window's first context token in the whole context
    context_offset: int  # position of the first context token inside `encoding`
    n_context: int  # number of context tokens in this window


@dataclass
class QAInput:
    context: str
    context_tokens: Tokens
    windows: list[QAWindow] = field(default_factory=list)


@dataclass
class Answer:
    text: str
    start: int
    end: int
    score: float
    logit: float = 0.0


def window_capacity(max_seq_len: int, query_len: int, specials: int = 3) -> int:
    """Context tokens a window holds: [CLS] question [SEP] context [SEP] (3 specials; RoBERTa's
    <s> question </s></s> context </s> has 4)."""
    return max_seq_len - query_len - specials


def make_windows(
    tokenizer: TextTokenizer,
    question: str,
    context: str,
    max_seq_len: int = 384,
    doc_stride: int = 128,
    max_query_len: int = 64,
) -> QAInput:
    question_tokens = tokenizer.tokenize(question)
    question_tokens = question_tokens.slice(0, max_query_len)
    specials = tokenizer.n_special(pair=True)
    capacity = window_capacity(max_seq_len, len(question_tokens), specials)
    if capacity < 1:
        raise ValueError(f"max_seq_len {max_seq_len} leaves no room for context after the question")
    if doc_stride >= capacity:
        raise ValueError(
            f"doc_stride {doc_stride} does not fit the window: windows hold {capacity} context tokens "
            f"(max_seq_len {max_seq_len} - question {len(question_tokens)} - {specials} special tokens); "
            f"doc_stride is the overlap between windows and must be smaller"
        )
    context_tokens = tokenizer.tokenize(context)
    result = QAInput(context=context, context_tokens=context_tokens)
    offset = tokenizer.pair.before(1) + len(question_tokens)  # [CLS] question [SEP] | <s> q </s></s>
    for start, end in window_spans(len(context_tokens), capacity, doc_stride):
        encoding = tokenizer.build(question_tokens, context_tokens.slice(start, end))
        result.windows.append(QAWindow(encoding, start, offset, end - start))
    return result


def char_to_token_span(tokens: Tokens, char_start: int, char_end: int) -> tuple[int, int] | None:
    """Token indices [first, last] covering the character span [char_start, char_end)."""
    starts, ends = tokens.offsets[:, 0], tokens.offsets[:, 1]
    inside = np.nonzero((ends > char_start) & (starts < char_end))[0]
    if len(inside) == 0:
        return None
    return int(inside[0]), int(inside[-1])


def training_positions(qa: QAInput, window: QAWindow, span: tuple[int, int] | None) -> tuple[int, int]:
    """Gold start/end positions in the window's encoding; (0, 0) = [CLS] when the answer is not inside."""
    if span is None:
        return 0, 0
    first, last = span
    if first < window.token_start or last >= window.token_start + window.n_context:
        return 0, 0
    shift = window.context_offset - window.token_start
    return first + shift, last + shift


def best_answers(
    qa: QAInput,
    start_logits: list[np.ndarray],
    end_logits: list[np.ndarray],
    top_k: int = 1,
    n_best: int = 20,
    max_answer_len: int = 30,
    handle_impossible_answer: bool = False,
) -> list[Answer]:
    """Merge candidates from every window; `max_answer_len` counts tokens.

    A span found by two overlapping windows keeps its best logit. With
    `handle_impossible_answer`, the empty answer competes with the best null score.
    """
    candidates: dict[tuple[int, int], float] = {}
    null_logit = np.inf
    for window, s_logits, e_logits in zip(qa.windows, start_logits, end_logits, strict=True):
        s_ctx = np.asarray(s_logits[window.context_offset : window.context_offset + window.n_context])
        e_ctx = np.asarray(e_logits[window.context_offset : window.context_offset + window.n_context])
        null_logit = min(null_logit, float(s_logits[0] + e_logits[0]))
        for i, j, logit in top_spans(s_ctx, e_ctx, n_best, max_answer_len):
            key = (window.token_start + i, window.token_start + j)
            if logit > candidates.get(key, -np.inf):
                candidates[key] = logit
    ranked = sorted(candidates.items(), key=lambda kv: -kv[1])[: max(n_best, top_k)]
    logits = np.array([logit for _, logit in ranked] + ([null_logit] if handle_impossible_answer else []))
    if len(logits) == 0:
        return []
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    offsets = qa.context_tokens.offsets
    answers = [
        Answer(
            text=qa.context[offsets[i, 0] : offsets[j, 1]],
            start=int(offsets[i, 0]),
            end=int(offsets[j, 1]),
            score=float(p),
            logit=float(logit),
        )
        for ((i, j), logit), p in zip(ranked, probs, strict=False)
    ]
    if handle_impossible_answer:
        answers.append(Answer(text="", start=0, end=0, score=float(probs[-1]), logit=null_logit))
        answers.sort(key=lambda a: -a.score)
    return answers[:top_k]


def top_spans(
    start_logits: np.ndarray, end_logits: np.ndarray, n_best: int, max_answer_len: int
) -> list[tuple[int, int, float]]:
    """The n_best highest start+end spans with start <= end < start + max_answer_len."""
    n = len(start_logits)
    if n == 0:
        return []
    k = min(n, n_best)
    starts = np.argpartition(-start_logits, k - 1)[:k]
    ends = np.argpartition(-end_logits, k - 1)[:k]
    spans = [
        (int(i), int(j), float(start_logits[i] + end_logits[j]))
        for i in starts
        for j in ends
        if i <= j < i + max_answer_len
    ]
    spans.sort(key=lambda t: -t[2])
    return spans[:n_best]
