"""processing.metrics against hand-computed values and the reference scripts' semantics."""

from __future__ import annotations

import math

import pytest

from processing.metrics import (
    accuracy,
    entity_scores,
    exact_match,
    f1_score,
    get_entities,
    normalize_answer,
    pearson,
    rankdata,
    spearman,
    squad_scores,
    token_f1,
)


def test_accuracy_and_f1() -> None:
    assert accuracy([1, 0, 1, 1], [1, 0, 0, 1]) == 0.75
    # binary F1 of class 1: tp=2, fp=1, fn=1 -> p=r=2/3
    assert f1_score([1, 0, 1, 1, 0], [1, 0, 0, 1, 1], num_labels=2) == pytest.approx(2 / 3)
    # macro over 3 classes: class 0 f1=1, class 1 f1=2/3 (tp1 fp0 fn1), class 2 f1=2/3 (tp1 fp1 fn0)
    assert f1_score([0, 1, 2, 2], [0, 1, 1, 2], num_labels=3) == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    with pytest.raises(ValueError):
        accuracy([1, 0], [1])


def test_pearson_and_spearman_with_ties() -> None:
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert rankdata([10, 20, 20, 30]).tolist() == [1, 2.5, 2.5, 4]
    # ranks x = [1, 2.5, 2.5, 4], y = [1, 3, 2, 4]: cov 4.5, var 4.5 and 5
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # constant input: defined as 0, not nan


# ----------------------------------------------------------------------------- NER


def test_entities_iob2() -> None:
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"]
    assert get_entities(tags) == [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 5)]


def test_entities_iob1() -> None:
    # IOB1: I- opens an entity; B- only splits two adjacent entities of one type.
    tags = ["I-ORG", "I-ORG", "O", "I-LOC", "B-LOC", "I-PER", "I-MISC"]
    assert get_entities(tags) == [("ORG", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4), ("PER", 5, 5), ("MISC", 6, 6)]


def test_entities_seqeval_default_mode_quirks() -> None:
    # An I- of another type after B- starts a new chunk; an I- after O starts one too.
    assert get_entities(["B-PER", "I-LOC", "O", "I-PER"]) == [("PER", 0, 0), ("LOC", 1, 1), ("PER", 3, 3)]
    assert get_entities(["O", "O"]) == []


def test_entity_scores_seqeval_readme_example() -> None:
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    scores = entity_scores(gold, pred)
    assert scores["precision"] == pytest.approx(0.5)
    assert scores["recall"] == pytest.approx(0.5)
    assert scores["f1"] == pytest.approx(0.5)
    assert scores["f1_PER"] == 1.0 and scores["f1_MISC"] == 0.0


def test_entity_scores_do_not_join_across_sentences() -> None:
    # The same span in two sentences counts twice; an entity at the end of one sentence does not
    # run into the next.
    gold = [["O", "B-PER"], ["I-PER", "O"]]
    pred = [["O", "B-PER"], ["O", "O"]]
    scores = entity_scores(gold, pred)
    assert (scores["precision"], scores["recall"]) == (1.0, 0.5)


def test_entity_scores_iob1_against_iob2_gold() -> None:
    # The same entities written in IOB1 and IOB2 score perfectly against each other.
    iob2 = [["B-ORG", "I-ORG", "O", "B-LOC", "B-LOC"]]
    iob1 = [["I-ORG", "I-ORG", "O", "I-LOC", "B-LOC"]]
    assert entity_scores(iob2, iob1)["f1"] == 1.0


def test_entity_scores_empty_and_length_mismatch() -> None:
    assert entity_scores([["O"]], [["O"]])["f1"] == 0.0
    with pytest.raises(ValueError, match="sentence 0"):
        entity_scores([["O", "O"]], [["O"]])


# ----------------------------------------------------------------------------- SQuAD


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("The Cat!", "cat"),
        ("  an   apple, a pear ", "apple pear"),
        ("Theater", "theater"),  # articles only as whole words
        ("U.S.", "us"),
        ("the", ""),
    ],
)
def test_normalize_answer(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


def test_exact_match_and_f1() -> None:
    assert exact_match("the Denver Broncos", "Denver Broncos.") == 1.0
    assert exact_match("Broncos", "Denver Broncos") == 0.0
    # [big, cat, sat] vs [cat, sat, down]: 2 shared, p = r = 2/3
    assert token_f1("the big cat sat", "a cat sat down") == pytest.approx(2 / 3)
    # repeated tokens count by multiplicity: [a?] no - [cat, cat] vs [cat]: 1 shared, p=1/2, r=1
    assert token_f1("cat cat", "cat") == pytest.approx(2 / 3)
    assert token_f1("", "cat") == 0.0
    assert token_f1("", "") == 1.0


def test_squad_scores_max_over_gold_answers() -> None:
    predictions = {"q1": "cat", "q2": "the Eiffel tower", "q3": "wrong"}
    gold = {"q1": ["dog", "big cat"], "q2": ["Eiffel Tower", "tower"], "q3": ["right"]}
    scores = squad_scores(predictions, gold)
    # q1: EM 0, F1 max(0, 2/3); q2: EM 1, F1 1; q3: 0, 0
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (2 / 3 + 1) / 3)


def test_squad_v2_unanswerable_and_missing_predictions() -> None:
    gold = {"q1": [], "q2": [], "q3": ["Paris"]}
    scores = squad_scores({"q1": "", "q2": "something"}, gold)  # q3 has no prediction: wrong
    assert scores == {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(100 / 3)}
