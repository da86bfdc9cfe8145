"""NER: labels on first sub-tokens, windows merged, sub-tokens and words aggregated into entities."""

from __future__ import annotations

import numpy as np
import pytest

from processing.ner import (
    IGNORE,
    aggregate_entities,
    align_labels,
    group_entities,
    make_windows,
    merge_window_logits,
    tokenize_text,
    word_predictions,
)

from .conftest import pieces

ID2LABEL = dict(enumerate(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]))
LABEL = {v: k for k, v in ID2LABEL.items()}


def one_hot(labels: list[str], high: float = 8.0) -> np.ndarray:
    logits = np.zeros((len(labels), len(ID2LABEL)))
    for i, label in enumerate(labels):
        logits[i, LABEL[label]] = high
    return logits


def test_a_word_label_goes_to_its_first_sub_token_only(tiny) -> None:
    tokens = tiny.tokenize_words(["johnxy", "lives", "in", "paris"])  # john ##x ##y lives in paris
    assert pieces(tiny, tokens.ids) == ["john", "##x", "##y", "lives", "in", "paris"]
    encoding = tiny.build(tokens)
    labels = align_labels(encoding.word_ids, [1, 0, 0, 3])
    assert labels.tolist() == [IGNORE, 1, IGNORE, IGNORE, 0, 0, 3, IGNORE]


def test_empty_text_has_no_entities(tiny) -> None:
    tokens = tokenize_text(tiny, "", "conll")
    assert len(tokens) == 0
    assert aggregate_entities("", tokens, np.zeros((0, len(ID2LABEL))), ID2LABEL) == []


def test_words_by_the_conll_rule_keep_offsets_into_the_raw_text(tiny) -> None:
    text = "john smith lives in paris."
    tokens = tokenize_text(tiny, text, "conll")
    words = [text[s:e] for s, e in tokens.offsets]
    assert words == ["john", "smith", "lives", "in", "paris", "."]
    assert tokens.word_ids.tolist() == [0, 1, 2, 3, 4, 5]


def test_b_and_i_make_one_entity_with_its_characters(tiny) -> None:
    text = "john smith lives in paris."
    tokens = tokenize_text(tiny, text, "conll")
    logits = one_hot(["B-PER", "I-PER", "O", "O", "B-LOC", "O"])
    entities = aggregate_entities(text, tokens, logits, ID2LABEL, "first")
    assert [(e.entity, e.text, e.start, e.end) for e in entities] == [
        ("PER", "john smith", 0, 10),
        ("LOC", "paris", 20, 25),
    ]
    assert all(0.99 < e.score <= 1.0 for e in entities)


def test_iob1_i_tags_open_an_entity_and_b_splits_two_of_one_type() -> None:
    text = "aa bb cc dd"
    units = [(0, 2, "I-PER", 0.9), (3, 5, "I-PER", 0.7), (6, 8, "B-PER", 0.8), (9, 11, "I-LOC", 0.6)]
    entities = group_entities(text, units)
    assert [(e.entity, e.text) for e in entities] == [("PER", "aa bb"), ("PER", "cc"), ("LOC", "dd")]
    assert entities[0].score == pytest.approx(0.8)


def test_sub_token_strategies(tiny) -> None:
    text = "johnxy lives"  # john ##x ##y | lives
    tokens = tokenize_text(tiny, text, "conll")
    logits = np.zeros((4, len(ID2LABEL)))
    logits[0, LABEL["O"]] = 4.0  # first sub-token says O ...
    logits[1, LABEL["B-PER"]] = 9.0  # ... the others, confidently, B-PER
    logits[2, LABEL["B-PER"]] = 9.0
    logits[3, LABEL["O"]] = 9.0
    assert aggregate_entities(text, tokens, logits, ID2LABEL, "first") == []
    for strategy in ("average", "max"):
        entities = aggregate_entities(text, tokens, logits, ID2LABEL, strategy)
        assert [(e.entity, e.text, e.start, e.end) for e in entities] == [("PER", "johnxy", 0, 6)], strategy
    simple = aggregate_entities(text, tokens, logits, ID2LABEL, "simple")  # tokens, not words: B- opens each
    assert [e.text for e in simple] == ["x", "y"]
    none = aggregate_entities(text, tokens, logits, ID2LABEL, "none")
    assert [(e.entity, e.text) for e in none] == [
        ("B-PER", "x"),
        ("B-PER", "y"),
    ]  # raw labels, as HF's "none"
    with pytest.raises(ValueError, match="aggregation"):
        aggregate_entities(text, tokens, logits, ID2LABEL, "vote")


def test_word_predictions_group_by_word() -> None:
    logits = np.array([[0.0, 5.0], [5.0, 0.0], [0.0, 0.0]])
    per_word = word_predictions(np.array([0, 0, 1]), logits, "average")
    assert sorted(per_word) == [0, 1]
    assert per_word[0] == pytest.approx([0.5, 0.5])


def test_windows_of_exactly_the_model_length_and_one_token_more(tiny) -> None:
    tokens = tiny.tokenize("one two three four five cat dog ran")  # 8 tokens
    assert len(make_windows(tiny, tokens, max_seq_len=10, overlap=2)) == 1
    windows = make_windows(tiny, tiny.tokenize("one two three four five cat dog ran sat"), 10, 2)
    assert [(w.token_start, w.n_tokens) for w in windows] == [(0, 8), (6, 3)]
    assert all(len(w.encoding) <= 10 for w in windows)


def test_merged_logits_take_each_token_from_the_window_where_it_is_most_central(tiny) -> None:
    tokens = tiny.tokenize(" ".join(["cat"] * 12))
    windows = make_windows(tiny, tokens, max_seq_len=8, overlap=3)  # 6 tokens a window
    assert len(windows) > 1
    logits = [np.full((len(w.encoding), 2), float(k)) for k, w in enumerate(windows)]
    merged = merge_window_logits(len(tokens), windows, logits)
    source = merged[:, 0].astype(int).tolist()
    for position, k in enumerate(source):
        window = windows[k]
        assert window.token_start <= position < window.token_start + window.n_tokens
        margin = min(position - window.token_start, window.token_start + window.n_tokens - 1 - position)
        for other in windows:
            if other.token_start <= position < other.token_start + other.n_tokens:
                assert margin >= min(
                    position - other.token_start, other.token_start + other.n_tokens - 1 - position
                )
