"""The word rule NER models are trained with, as serving applies it to raw text."""

from __future__ import annotations

from pathlib import Path

import pytest

from processing.ner import tokenize_text
from processing.tokenizer import TextTokenizer
from processing.words import split_words
from tests.helpers.tiny import write_tokenizer_files

CONLL = Path(__file__).resolve().parents[3] / "shared" / "data" / "conll2003"


def words(text: str, rule: str = "conll") -> list[str]:
    return [text[s:e] for s, e in split_words(text, rule)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("P. Simmons", ["P.", "Simmons"]),
        ("the U.S. and U.N. at 9 a.m.", ["the", "U.S.", "and", "U.N.", "at", "9", "a.m."]),
        ("Chester-le-Street", ["Chester-le-Street"]),
        ("an ex-England captain", ["an", "ex-England", "captain"]),
        ("O'Gorman", ["O'Gorman"]),
        ("to Paris.", ["to", "Paris", "."]),
        ("Paris, France; Berlin: yes!", ["Paris", ",", "France", ";", "Berlin", ":", "yes", "!"]),
        ("Germany's team doesn't", ["Germany", "'s", "team", "does", "n't"]),
        ('(Reuters) "quoted"', ["(", "Reuters", ")", '"', "quoted", '"']),
        ("Acme Corp. said 3. wait ... Mr. X", ["Acme", "Corp.", "said", "3.", "wait", "...", "Mr.", "X"]),
        ("Pâris…", ["Pâris", "…"]),
        ("", []),
        (" \n\t ", []),
        (".", ["."]),
    ],
)
def test_conll_words(text: str, expected: list[str]) -> None:
    assert words(text) == expected


def test_spans_are_exact_across_runs_of_spaces_and_newlines() -> None:
    text = "  John \n\n  Smith\t\tlives   in\r\nParis.  "
    spans = split_words(text, "conll")
    assert [text[s:e] for s, e in spans] == ["John", "Smith", "lives", "in", "Paris", "."]
    assert spans[0] == (2, 6) and spans[-1] == (len(text) - 3, len(text) - 2)
    assert words(text, "whitespace") == ["John", "Smith", "lives", "in", "Paris."]


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="word_split"):
        split_words("a b", "spacy")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    directory = tmp_path_factory.mktemp("vocab")
    write_tokenizer_files(directory)
    return TextTokenizer.from_dir(directory)


@pytest.mark.parametrize("rule", ["conll", "whitespace", "bert"])
def test_token_offsets_point_into_the_raw_text(tokenizer: TextTokenizer, rule: str) -> None:
    text = "J. Smith's  ex-Paris\n\ncafé, naïve 😀 (U.S.)."
    tokens = tokenize_text(tokenizer, text, rule)
    for (start, end), word in zip(tokens.offsets.tolist(), tokens.word_ids.tolist(), strict=True):
        assert 0 <= start < end <= len(text) and text[start:end].strip() == text[start:end]
        assert word >= 0
    assert tokens.offsets[:, 0].tolist() == sorted(tokens.offsets[:, 0].tolist())


def test_a_word_keeps_its_punctuation_under_conll_but_not_under_bert(tokenizer: TextTokenizer) -> None:
    text = "J. Smith in Chester-le-Street."
    conll = tokenize_text(tokenizer, text, "conll")
    bert = tokenize_text(tokenizer, text, "bert")

    def word_texts(tokens) -> list[str]:
        spans: dict[int, list[int]] = {}
        for (start, end), word in zip(tokens.offsets.tolist(), tokens.word_ids.tolist(), strict=True):
            spans.setdefault(word, [start, end])[1] = end
        return [text[s:e] for s, e in spans.values()]

    assert word_texts(conll) == ["J.", "Smith", "in", "Chester-le-Street", "."]
    assert word_texts(bert) == ["J", ".", "Smith", "in", "Chester", "-", "le", "-", "Street", "."]


def test_empty_text(tokenizer: TextTokenizer) -> None:
    assert len(tokenize_text(tokenizer, "", "conll")) == 0
    assert len(tokenize_text(tokenizer, "   ", "whitespace")) == 0


@pytest.mark.data
@pytest.mark.skipif(not CONLL.exists(), reason=f"{CONLL} is absent (real CoNLL-2003 data)")
@pytest.mark.parametrize("split", ["train.txt", "dev.txt"])
def test_conll_rule_gives_back_every_conll_sentence(split: str) -> None:
    """Words joined by single spaces, as a user sends a tokenized sentence, come back unchanged."""
    from train.readers import read_examples

    examples = read_examples("ner", CONLL / split)
    differ = [e.words for e in examples if words(" ".join(e.words)) != e.words]
    assert not differ, differ[:5]
