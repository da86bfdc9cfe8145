"""Classification windows and scores, and multiple-choice packing."""

from __future__ import annotations

import numpy as np
import pytest

from processing.choice import choice_from_logits, choice_second_segment, encode_choices, pack_choice
from processing.classify import classify_from_logits, encode_for_classify

from .conftest import pieces

EIGHT = "one two three four five cat dog ran"


def test_truncate_gives_one_encoding_and_says_so(tiny) -> None:
    [exact] = encode_for_classify(tiny, EIGHT, max_seq_len=10)
    assert len(exact) == 10 and not exact.truncated
    [cut] = encode_for_classify(tiny, EIGHT + " sat", max_seq_len=10)
    assert len(cut) == 10 and cut.truncated


def test_windows_split_a_long_text_with_overlap(tiny) -> None:
    assert len(encode_for_classify(tiny, EIGHT, max_seq_len=10, long_text="windows", window_overlap=2)) == 1
    windows = encode_for_classify(
        tiny, EIGHT + " sat mat", max_seq_len=10, long_text="windows", window_overlap=2
    )
    assert [pieces(tiny, w.input_ids) for w in windows] == [
        ["[CLS]", *EIGHT.split(), "[SEP]"],
        ["[CLS]", "dog", "ran", "sat", "mat", "[SEP]"],
    ]
    # A pair is never windowed.
    assert len(encode_for_classify(tiny, EIGHT + " sat mat", "cat", max_seq_len=10, long_text="windows")) == 1
    with pytest.raises(ValueError, match="long_text"):
        encode_for_classify(tiny, EIGHT, long_text="chunks")


def test_empty_and_single_token_texts(tiny) -> None:
    assert pieces(tiny, encode_for_classify(tiny, "", long_text="windows")[0].input_ids) == ["[CLS]", "[SEP]"]
    assert pieces(tiny, encode_for_classify(tiny, "cat")[0].input_ids) == ["[CLS]", "cat", "[SEP]"]


def test_window_scores_are_averaged_then_ranked() -> None:
    logits = np.array([[0.0, 2.0], [2.0, 0.0], [0.0, 4.0]])
    result = classify_from_logits(logits, ["negative", "positive"])
    assert result.label == "positive" and result.windows == 3
    assert sum(s.score for s in result.scores) == pytest.approx(1.0)
    first = classify_from_logits(logits, ["negative", "positive"], aggregation="first")
    assert first.score == pytest.approx(1 / (1 + np.exp(-2.0)))
    assert [s.label for s in classify_from_logits(logits, ["n", "p"], top_k=1).scores] == ["p"]


def test_ties_keep_label_order_and_regression_reports_a_value() -> None:
    tie = classify_from_logits(np.array([[1.0, 1.0]]), ["a", "b"])
    assert [s.label for s in tie.scores] == ["a", "b"]
    value = classify_from_logits(np.array([[2.0], [4.0]]), ["score"], regression=True)
    assert value.value == pytest.approx(3.0) and value.label == "score"


def test_each_choice_is_packed_after_the_shared_context(tiny) -> None:
    encodings = encode_choices(tiny, "the cat sat on the mat", "where", ["house", "city"], max_seq_len=16)
    assert [pieces(tiny, e.input_ids) for e in encodings] == [
        ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]", "where", "house", "[SEP]"],
        ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]", "where", "city", "[SEP]"],
    ]
    assert encodings[0].token_type_ids.tolist() == [0] * 8 + [1] * 3


def test_a_long_context_is_cut_first_and_a_long_choice_keeps_half_the_room(tiny) -> None:
    context = tiny.tokenize(" ".join(["cat"] * 20))
    short = pack_choice(tiny, context, tiny.tokenize("dog"), max_seq_len=12)
    assert len(short) == 12 and pieces(tiny, short.input_ids[-2:]) == ["dog", "[SEP]"]
    long_choice = pack_choice(tiny, context, tiny.tokenize(" ".join(["dog"] * 20)), max_seq_len=12)
    assert len(long_choice) == 12
    assert pieces(tiny, long_choice.input_ids).count("dog") == (12 - 3) // 2
    fits = pack_choice(tiny, tiny.tokenize("cat"), tiny.tokenize("dog"), max_seq_len=5)
    assert pieces(tiny, fits.input_ids) == ["[CLS]", "cat", "[SEP]", "dog", "[SEP]"]


def test_cloze_questions_get_the_option_filled_in() -> None:
    assert choice_second_segment("the _ sat", "cat") == "the cat sat"
    assert choice_second_segment("who sat", "cat") == "who sat cat"
    assert choice_second_segment(None, "cat") == "cat"
    assert choice_second_segment("", "cat") == "cat"


def test_choice_scores_are_a_softmax_over_choices() -> None:
    result = choice_from_logits(np.array([[1.0], [3.0], [0.0]]), ["a", "b", "c"])
    assert result.best == 1 and result.choice == "b"
    assert sum(result.scores) == pytest.approx(1.0) and result.scores[1] == max(result.scores)
