"""scaling.py: the FLOP formula by hand, the floor split, and the measured peak."""

from __future__ import annotations

import pytest

from benchmarks import scaling


def test_minilm_flops_match_a_hand_count():
    # Per layer at 128 tokens, hidden 384, FFN 1536 (multiply-add = 2 FLOPs):
    #   Q, K, V, output dense: 4 * 2 * 128 * 384 * 384 = 150,994,944
    #   scores and context:    2 * 2 * 128 * 128 * 384 =  25,165,824
    #   FFN up and down:       2 * 2 * 128 * 384 * 1536 = 301,989,888
    # 6 layers = 2,868,903,936; pooler 2 * 384 * 384 + classifier 2 * 384 * 2 = 296,448.
    flops = scaling.bert_flops(128, hidden=384, layers=6, intermediate=1536, num_labels=2)
    assert flops["total"] == 2_869_200_384
    assert flops["attention"] == 6 * 25_165_824
    assert flops["projections"] + flops["attention"] + flops["ffn"] + flops["head"] == flops["total"]


def test_flops_scale_with_batch_and_quadratically_in_attention():
    one = scaling.bert_flops(64, 32, 2, 64)
    assert scaling.bert_flops(64, 32, 2, 64, batch=8)["total"] == 8 * one["total"]
    assert scaling.bert_flops(128, 32, 2, 64)["attention"] == 4 * one["attention"]
    assert scaling.bert_flops(128, 32, 2, 64)["ffn"] == 2 * one["ffn"]
    with pytest.raises(ValueError):
        scaling.bert_flops(0, 32, 2, 64)


def test_floor_charges_attention_at_the_fp32_peak_for_int8():
    flops = {"total": 10e9, "attention": 2e9}
    peak = {"fp32": 100.0, "int8": 400.0}
    assert scaling.floor_seconds(flops, "fp32", peak) == pytest.approx(0.1)
    assert scaling.floor_seconds(flops, "int8", peak) == pytest.approx(8e9 / 400e9 + 2e9 / 100e9)


def test_measured_peak_covers_both_precisions():
    peak = scaling.measure_peak(1, [(8, 16, 8)], runs=2, budget_s=0.05)
    assert {row["precision"] for row in peak["measurements"]} == {"fp32", "int8"}
    assert peak["peak_gflops"]["fp32"] > 0 and peak["peak_gflops"]["int8"] > 0
