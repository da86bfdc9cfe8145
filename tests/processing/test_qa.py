"""QA windows over long contexts, and n-best answers merged across windows."""

from __future__ import annotations

import numpy as np
import pytest

from processing.qa import (
    best_answers,
    char_to_token_span,
    make_windows,
    top_spans,
    training_positions,
    window_capacity,
)

from .conftest import pieces

CONTEXT = "one two three four five cat dog ran sat mat"  # ten words of the tiny vocab, one token each


def context_tokens_of(tokenizer, window) -> list[str]:
    ids = window.encoding.input_ids[window.context_offset : window.context_offset + window.n_context]
    return pieces(tokenizer, ids)


def test_window_layout_question_first_context_second(tiny) -> None:
    qa = make_windows(tiny, "who won", CONTEXT, max_seq_len=32, doc_stride=4, max_query_len=8)
    assert len(qa.windows) == 1
    window = qa.windows[0]
    assert pieces(tiny, window.encoding.input_ids[:4]) == ["[CLS]", "who", "won", "[SEP]"]
    assert window.context_offset == 4 and window.n_context == 10 and window.token_start == 0
    assert window.encoding.sequence_ids[window.context_offset] == 1


def test_context_exactly_filling_a_window_needs_one_more_token_for_a_second(tiny) -> None:
    question = "who"  # 1 token: capacity = max_seq_len - 1 - 3
    assert window_capacity(14, 1) == 10
    assert len(make_windows(tiny, question, CONTEXT, max_seq_len=14, doc_stride=3).windows) == 1
    qa = make_windows(tiny, question, CONTEXT + " one", max_seq_len=14, doc_stride=3)
    assert [(w.token_start, w.n_context) for w in qa.windows] == [(0, 10), (7, 4)]
    assert all(len(w.encoding) <= 14 for w in qa.windows)


def test_long_context_windows_overlap_by_doc_stride_and_cover_everything(tiny) -> None:
    context = " ".join([CONTEXT] * 5)  # 50 tokens
    qa = make_windows(tiny, "what", context, max_seq_len=16, doc_stride=4)
    capacity = window_capacity(16, 1)
    starts = [w.token_start for w in qa.windows]
    assert all(b - a == capacity - 4 for a, b in zip(starts, starts[1:-1], strict=False))
    assert qa.windows[-1].token_start + qa.windows[-1].n_context == 50
    assert all(len(w.encoding) <= 16 for w in qa.windows)
    seen = set().union(*(range(w.token_start, w.token_start + w.n_context) for w in qa.windows))
    assert seen == set(range(50))
    for window in qa.windows:
        expected = pieces(
            tiny, qa.context_tokens.ids[window.token_start : window.token_start + window.n_context]
        )
        assert context_tokens_of(tiny, window) == expected


def test_the_question_is_cut_to_max_query_len(tiny) -> None:
    qa = make_windows(
        tiny, "one two three four five cat", CONTEXT, max_seq_len=32, doc_stride=4, max_query_len=3
    )
    assert qa.windows[0].context_offset == 3 + 2


def test_a_stride_that_does_not_fit_names_the_window(tiny) -> None:
    with pytest.raises(ValueError, match="doc_stride 10 does not fit"):
        make_windows(tiny, "who", CONTEXT, max_seq_len=14, doc_stride=10)
    with pytest.raises(ValueError, match="no room for context"):
        make_windows(tiny, "one two three four", CONTEXT, max_seq_len=7, doc_stride=0)


def test_empty_context_gives_one_window_and_no_answer(tiny) -> None:
    qa = make_windows(tiny, "who", "", max_seq_len=16, doc_stride=4)
    assert len(qa.windows) == 1 and qa.windows[0].n_context == 0
    logits = [np.zeros(len(qa.windows[0].encoding))]
    assert best_answers(qa, logits, logits) == []


def logits_for(qa, window_index: int, start: int, end: int, value: float) -> tuple[list, list]:
    """Start/end logits for every window, peaked at context tokens start..end of one window."""
    starts = [np.full(len(w.encoding), -10.0) for w in qa.windows]
    ends = [np.full(len(w.encoding), -10.0) for w in qa.windows]
    w = qa.windows[window_index]
    starts[window_index][w.context_offset + start - w.token_start] = value
    ends[window_index][w.context_offset + end - w.token_start] = value
    return starts, ends


def test_best_answer_maps_back_to_characters_across_windows(tiny) -> None:
    context = " ".join([CONTEXT] * 3)  # 30 tokens, several windows
    qa = make_windows(tiny, "what", context, max_seq_len=16, doc_stride=4)
    assert len(qa.windows) > 2
    last = len(qa.windows) - 1
    first_token = qa.windows[last].token_start + 2
    starts, ends = logits_for(qa, last, first_token, first_token + 1, 5.0)
    answer = best_answers(qa, starts, ends, max_answer_len=5)[0]
    offsets = qa.context_tokens.offsets
    assert (answer.start, answer.end) == (offsets[first_token, 0], offsets[first_token + 1, 1])
    assert answer.text == context[answer.start : answer.end] and len(answer.text.split()) == 2


def test_a_span_seen_by_two_windows_keeps_its_best_logit(tiny) -> None:
    context = " ".join([CONTEXT] * 2)
    qa = make_windows(tiny, "what", context, max_seq_len=16, doc_stride=6)
    a, b = qa.windows[0], qa.windows[1]
    shared = b.token_start  # inside both windows
    assert shared < a.token_start + a.n_context
    starts, ends = logits_for(qa, 0, shared, shared, 3.0)
    starts_b, ends_b = logits_for(qa, 1, shared, shared, 7.0)
    starts[1], ends[1] = starts_b[1], ends_b[1]
    answers = best_answers(qa, starts, ends, top_k=3)
    spans = [(x.start, x.end) for x in answers]
    assert len(set(spans)) == len(spans)  # merged, not listed twice
    assert answers[0].logit == pytest.approx(14.0)


def test_max_answer_len_and_the_impossible_answer(tiny) -> None:
    qa = make_windows(tiny, "what", CONTEXT, max_seq_len=32, doc_stride=4)
    starts, ends = logits_for(qa, 0, 0, 6, 5.0)  # a 7-token span
    assert all(len(a.text.split()) <= 3 for a in best_answers(qa, starts, ends, top_k=5, max_answer_len=3))
    starts[0][0] = ends[0][0] = 20.0  # [CLS]: the null answer wins when allowed
    assert best_answers(qa, starts, ends, handle_impossible_answer=True)[0].text == ""
    assert best_answers(qa, starts, ends)[0].text != ""


def test_top_spans_orders_by_score_and_respects_the_length_limit() -> None:
    start = np.array([0.0, 3.0, 1.0, 0.0])
    end = np.array([0.0, 0.0, 2.0, 4.0])
    spans = top_spans(start, end, n_best=3, max_answer_len=2)
    assert spans[0] == (1, 2, 5.0)
    assert all(i <= j < i + 2 for i, j, _ in spans)
    assert [s for *_, s in spans] == sorted((s for *_, s in spans), reverse=True)
    assert top_spans(np.array([]), np.array([]), 3, 2) == []


def test_training_positions_point_inside_the_window_or_at_cls(tiny) -> None:
    context = " ".join([CONTEXT] * 2)
    qa = make_windows(tiny, "what", context, max_seq_len=16, doc_stride=4)
    start = context.index("dog")
    span = char_to_token_span(qa.context_tokens, start, start + len("dog ran"))
    assert span == (6, 7)
    first = qa.windows[0]
    s, e = training_positions(qa, first, span)
    assert pieces(tiny, first.encoding.input_ids[s : e + 1]) == ["dog", "ran"]
    outside = next(w for w in qa.windows if w.token_start > 7)
    assert training_positions(qa, outside, span) == (0, 0)
    assert training_positions(qa, first, None) == (0, 0)
    assert char_to_token_span(qa.context_tokens, len(context), len(context) + 3) is None
