"""rerank_quality: BM25 and the ranking metrics on hand-computed examples."""

from __future__ import annotations

import math

import pytest

from benchmarks.rerank_quality import BM25
from processing.metrics import ranking_scores


def test_bm25_matches_a_hand_computation():
    corpus = ["the cat sat", "the dog ran far away", "a bird"]
    bm25 = BM25(corpus)
    avgdl = (3 + 5 + 2) / 3
    idf_cat = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    norm = 1.2 * (1 - 0.75 + 0.75 * 3 / avgdl)
    assert bm25.score("Cat?", "the cat sat") == pytest.approx(idf_cat * 2.2 / (1 + norm))
    idf_the = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    norm_dog = 1.2 * (1 - 0.75 + 0.75 * 5 / avgdl)
    assert bm25.score("the dog", "the dog ran far away") == pytest.approx(
        (idf_the + math.log(1 + 2.5 / 1.5)) * 2.2 / (1 + norm_dog)
    )
    assert bm25.score("fish", "the cat sat") == 0.0
    # The shorter sentence with the same match ranks higher (length normalisation).
    assert bm25.score("the", "the cat sat") > bm25.score("the", "the dog ran far away")


def test_p_at_1_and_mrr_on_hand_numbers():
    rankings = [
        ([0.9, 0.1, 0.3], 0),  # first: RR 1
        ([0.2, 0.8, 0.5], 2),  # second: RR 1/2
        ([0.1, 0.2, 0.3, 0.4], 0),  # fourth: RR 1/4
    ]
    scores = ranking_scores(rankings)
    assert scores["p@1"] == pytest.approx(1 / 3)
    assert scores["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 4) / 3)
    assert scores["queries"] == 3


def test_ties_count_as_a_random_order():
    # All tied among 4: P@1 1/4, RR the mean of 1, 1/2, 1/3, 1/4.
    assert ranking_scores([([0.0] * 4, 2)]) == pytest.approx(
        {"p@1": 0.25, "mrr": (1 + 1 / 2 + 1 / 3 + 1 / 4) / 4, "queries": 1}
    )
    # One above, tied with one below it: rank 2 or 3.
    assert ranking_scores([([5.0, 1.0, 1.0], 2)])["mrr"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    with pytest.raises(ValueError):
        ranking_scores([])
