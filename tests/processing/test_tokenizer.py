"""Tokenization with offsets, pair building and truncation, and window spans."""

from __future__ import annotations

import numpy as np
import pytest

from processing.tokenizer import default_window_overlap, trim_whitespace, truncate_pair, window_spans

from .conftest import pieces


def test_offsets_point_at_each_token_in_the_text(tiny) -> None:
    text = "The cat sat on the mat, in Paris."
    tokens = tiny.tokenize(text)
    assert pieces(tiny, tokens.ids) == ["the", "cat", "sat", "on", "the", "mat", ",", "in", "paris", "."]
    assert [text[s:e] for s, e in tokens.offsets] == [
        "The",
        "cat",
        "sat",
        "on",
        "the",
        "mat",
        ",",
        "in",
        "Paris",
        ".",
    ]
    assert np.all(np.diff(tokens.offsets[:, 0]) > 0)


def test_sub_tokens_share_their_word_and_cover_it_together(tiny) -> None:
    text = "catxyz ran"  # not in the vocab: cat ##x ##y ##z
    tokens = tiny.tokenize(text)
    assert pieces(tiny, tokens.ids) == ["cat", "##x", "##y", "##z", "ran"]
    assert tokens.word_ids.tolist() == [0, 0, 0, 0, 1]
    assert [text[s:e] for s, e in tokens.offsets] == ["cat", "x", "y", "z", "ran"]


def test_empty_text_has_no_tokens_and_encodes_to_the_specials(tiny) -> None:
    assert len(tiny.tokenize("")) == 0
    assert len(tiny.tokenize("   \n\t")) == 0
    encoding = tiny.encode("")
    assert encoding.input_ids.tolist() == [tiny.cls_id, tiny.sep_id]
    assert encoding.offsets.tolist() == [[0, 0], [0, 0]] and not encoding.truncated


def test_a_single_token(tiny) -> None:
    encoding = tiny.encode("dog")
    assert pieces(tiny, encoding.input_ids) == ["[CLS]", "dog", "[SEP]"]
    assert encoding.sequence_ids.tolist() == [-1, 0, -1]
    assert encoding.word_ids.tolist() == [-1, 0, -1]
    assert encoding.offsets.tolist() == [[0, 0], [0, 3], [0, 0]]


def test_pair_segments_and_types(tiny) -> None:
    encoding = tiny.encode("good movie", "bad film")
    assert pieces(tiny, encoding.input_ids) == ["[CLS]", "good", "movie", "[SEP]", "bad", "film", "[SEP]"]
    assert encoding.token_type_ids.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert encoding.sequence_ids.tolist() == [-1, 0, 0, -1, 1, 1, -1]
    assert encoding.offsets[4].tolist() == [0, 3]  # offsets index their own text


def test_encode_exactly_at_max_length_is_not_truncated(tiny) -> None:
    text = "one two three four five"
    assert len(tiny.encode(text, max_length=7)) == 7 and not tiny.encode(text, max_length=7).truncated
    cut = tiny.encode(text, max_length=6)
    assert len(cut) == 6 and cut.truncated
    assert pieces(tiny, cut.input_ids[1:-1]) == ["one", "two", "three", "four"]


def test_truncation_cuts_the_longer_side_first(tiny) -> None:
    first, second = tiny.tokenize("one two three four five six"), tiny.tokenize("cat dog")
    a, b = truncate_pair(first, second, 3 + 5)
    assert (len(a), len(b)) == (3, 2)
    a, b = truncate_pair(tiny.tokenize("cat dog"), tiny.tokenize("one two three four five six"), 3 + 5)
    assert (len(a), len(b)) == (2, 3)
    with pytest.raises(ValueError, match="no room"):
        truncate_pair(first, second, 3)


def test_cjk_characters_are_tokens_of_one_character_each(minilm) -> None:
    text = "東京は日本"
    tokens = minilm.tokenize(text)
    assert pieces(minilm, tokens.ids) == list(text)
    assert tokens.offsets.tolist() == [[i, i + 1] for i in range(len(text))]


def test_an_emoji_is_one_unknown_token_spanning_it(minilm) -> None:
    text = "I 😀 you"
    tokens = minilm.tokenize(text)
    assert pieces(minilm, tokens.ids) == ["i", "[UNK]", "you"]
    assert text[slice(*tokens.offsets[1])] == "😀"  # offsets count Python characters, not bytes
    assert text[slice(*tokens.offsets[2])] == "you"


def test_accents_are_stripped_but_offsets_stay_in_the_original_text(minilm) -> None:
    composed = "Café au lait"
    tokens = minilm.tokenize(composed)
    assert pieces(minilm, tokens.ids)[0] == "cafe"
    assert composed[slice(*tokens.offsets[0])] == "Café"
    decomposed = "cafe\u0301 ok"  # e + COMBINING ACUTE ACCENT
    tokens = minilm.tokenize(decomposed)
    assert pieces(minilm, tokens.ids) == ["cafe", "ok"]
    # The normalizer drops the mark; its span ends before it (the token maps to "cafe").
    assert decomposed[slice(*tokens.offsets[0])] == "cafe"
    assert decomposed[slice(*tokens.offsets[1])] == "ok"


@pytest.mark.parametrize(
    ("n", "capacity", "overlap", "expected"),
    [
        (0, 4, 1, [(0, 0)]),
        (1, 4, 1, [(0, 1)]),
        (4, 4, 1, [(0, 4)]),  # exactly the window: one
        (5, 4, 1, [(0, 4), (3, 5)]),  # one more: a second window sharing `overlap` tokens
        (10, 4, 0, [(0, 4), (4, 8), (8, 10)]),
        (10, 4, 3, [(0, 4), (1, 5), (2, 6), (3, 7), (4, 8), (5, 9), (6, 10)]),
    ],
)
def test_window_spans(n: int, capacity: int, overlap: int, expected: list[tuple[int, int]]) -> None:
    spans = window_spans(n, capacity, overlap)
    assert spans == expected
    covered = set().union(*(range(s, e) for s, e in spans))
    assert covered == set(range(n))


@pytest.mark.parametrize(("capacity", "overlap"), [(0, 0), (4, 4), (4, -1)])
def test_window_spans_refuse_impossible_windows(capacity: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        window_spans(10, capacity, overlap)


def test_default_window_overlap_is_32_at_most_a_quarter_window() -> None:
    assert default_window_overlap(512) == 32
    assert default_window_overlap(66) == 16
    assert default_window_overlap(10) == 2


def _trim_reference(offsets: np.ndarray, text: str) -> list[list[int]]:
    """trim_whitespace's rule, one token at a time in plain Python."""
    out = []
    for start, end in offsets.tolist():
        s, e = start, end
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if s == e:  # whitespace only: empty where the next solid character is
            s = next((i for i in range(start, len(text)) if not text[i].isspace()), len(text))
            s = e = min(s, end)
        out.append([s, e])
    return out


@pytest.mark.parametrize("seed", range(40))
def test_trim_whitespace_matches_the_rule_with_and_without_whitespace(seed: int) -> None:
    rng = np.random.default_rng(seed)
    alphabet = list("ab中文，") + [" ", "\t", "\u3000", "\u00a0", "\n"] * (seed % 2)  # odd seeds hold spaces
    text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 30))))
    cuts = np.sort(rng.integers(0, len(text) + 1, size=(8, 2)), axis=1)
    assert trim_whitespace(cuts.astype(np.int64), text).tolist() == _trim_reference(cuts, text)
