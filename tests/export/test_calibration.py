"""export.calibration: the features cut from calibration text, and error-feedback rounding."""

from __future__ import annotations

import numpy as np
import pytest

from export.calibration import CALIBRATION_TEXT, LONGEST, ROWS, SHORTEST, round_with_feedback, text_batches
from export.int8_precision import PAIR_BUDGET, pair_load
from export.quantize_rowwise import quantize_weight


def correlated_inputs(rng, tokens: int, width: int, seed: int = 7) -> np.ndarray:
    """[tokens, width] rows whose channels share a few factors (fixed by `seed`: one distribution)
    and a few are large, as BERT's do."""
    factors = np.random.default_rng(seed).standard_normal((8, width))
    x = rng.standard_normal((tokens, 8)) @ factors + 0.3 * rng.standard_normal((tokens, width))
    x[:, :3] *= 6.0
    return x


def output_error(x, weight, codes, scales) -> float:
    return float(
        np.linalg.norm(x @ (codes.astype(np.float64) * scales) - x @ weight) / np.linalg.norm(x @ weight)
    )


@pytest.mark.parametrize("budget", [None, PAIR_BUDGET])
def test_feedback_rounding_keeps_the_outputs_closer_and_every_bound(budget):
    rng = np.random.default_rng(0)
    x = correlated_inputs(rng, 2000, 64)
    weight = rng.standard_normal((64, 48)).astype(np.float32)
    weight[5, :] *= 4  # large same-signed pairs push the budget-bound scales up
    weight[4, :] = np.abs(weight[4, :]) * np.sign(weight[5, :]) * 4
    nearest, scales = quantize_weight(weight, budget)
    fed, same_scales = quantize_weight(weight, budget, x.T @ x)
    assert np.array_equal(scales, same_scales)
    assert fed.dtype == np.int8 and np.abs(fed.astype(int)).max() <= 127
    if budget is not None:
        assert pair_load(fed).max() <= budget
    held_out = correlated_inputs(np.random.default_rng(1), 2000, 64)
    assert output_error(held_out, weight, fed, scales) < 0.8 * output_error(held_out, weight, nearest, scales)


def test_feedback_rounding_without_correlations_is_nearest_rounding():
    """A diagonal X^T X moves no error to other rows: each code is the nearest one."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((32, 16)).astype(np.float32)
    scales = np.abs(weight).max(axis=0) / 127
    diagonal = np.diag(rng.uniform(0.5, 2.0, 32))
    expected = np.clip(np.rint(weight / scales), -127, 127)
    assert np.array_equal(round_with_feedback(weight, scales, diagonal), expected)


def test_feedback_rounding_zeroes_channels_the_inputs_never_use():
    """Outlier channels reach the INT8 matmul as zeros (an fp32 matmul carries them): code 0 there,
    which also frees their pairs' budget."""
    rng = np.random.default_rng(3)
    x = correlated_inputs(rng, 500, 16)
    x[:, [2, 9]] = 0.0
    weight = rng.standard_normal((16, 8)).astype(np.float32)
    codes = round_with_feedback(weight, np.abs(weight).max(axis=0) / 127, x.T @ x, PAIR_BUDGET)
    assert not codes[[2, 9]].any() and codes[[0, 1, 3]].any()


def test_the_pair_budget_caps_the_second_of_a_same_signed_pair():
    """Row 2j+1 gets what row 2j leaves of the budget on the same sign, and all of 127 on the other."""
    weight = np.array([[127.0, 127.0], [127.0, -127.0]], np.float32)  # columns: same-signed, opposite
    codes = round_with_feedback(weight, np.ones(2, np.float32), np.eye(2), PAIR_BUDGET)
    assert codes.tolist() == [[127, 127], [1, -127]]


class WordTokenizer:
    """The layout surface text_batches uses, over a word-level vocabulary: [CLS] a [SEP] (b [SEP])."""

    pad_id, cls_id, sep_id = 0, 1, 2

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def n_special(self, pair: bool = False) -> int:
        return 3 if pair else 2

    def tokenize_batch(self, texts):
        from processing.tokenizer import Tokens

        out = []
        for text in texts:
            ids = np.array([self.vocab.setdefault(w, len(self.vocab) + 3) for w in text.split()], np.int64)
            out.append(Tokens(ids, np.zeros((len(ids), 2), np.int64), np.arange(len(ids))))
        return out

    def build(self, first, second=None):
        from processing.tokenizer import Encoding

        ids = [self.cls_id, *first.ids, self.sep_id] + (
            [*second.ids, self.sep_id] if second is not None else []
        )
        n_first = len(first) + 2
        types = [0] * n_first + [1] * (len(ids) - n_first)
        zeros = np.zeros(len(ids), np.int64)
        return Encoding(np.array(ids), np.array(types), np.zeros((len(ids), 2), np.int64), zeros, zeros)


@pytest.mark.parametrize("task, shape", [("classify", (ROWS,)), ("multiple-choice", (ROWS, 4))])
def test_text_batches_are_laid_out_by_the_tokenizer(task, shape):
    tokenizer = WordTokenizer()
    batches = text_batches(task, tokenizer, max_seq_len=512)
    assert len(batches) == 8
    again = text_batches(task, WordTokenizer(), max_seq_len=512)
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again, strict=True))
    for batch in batches:
        ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        assert ids.shape == (*shape, LONGEST) and mask.shape == types.shape == ids.shape
        lengths = mask.sum(-1)
        assert lengths.min() >= SHORTEST and lengths.max() <= LONGEST
        assert (ids[..., 0] == tokenizer.cls_id).all() and (ids[mask == 0] == tokenizer.pad_id).all()
        rows = ids.reshape(-1, LONGEST)
        last = rows[np.arange(len(rows)), lengths.reshape(-1) - 1]
        assert (last == tokenizer.sep_id).all()
    pairs = np.concatenate([b["token_type_ids"].reshape(-1, LONGEST).max(-1) for b in batches])
    assert 0.3 < pairs.mean() < 0.7  # about half are pairs, as a question before a passage
    lengths = np.concatenate([b["attention_mask"].sum(-1).reshape(-1) for b in batches])
    assert np.median(lengths) < (SHORTEST + LONGEST) / 2  # log-uniform: short rows are the common ones
    short = text_batches(task, WordTokenizer(), max_seq_len=24)
    assert short[0]["input_ids"].shape[-1] == 24


def test_text_batches_fit_even_windows_shorter_than_any_bundle():
    """Every row fits max_seq_len, down to 4 tokens (bundles start at 8), and a pair keeps a token on
    each side or is not made."""
    for seq in (4, 8):
        for batch in text_batches("classify", WordTokenizer(), max_seq_len=seq):
            lengths, pairs = batch["attention_mask"].sum(-1), batch["token_type_ids"].max(-1) == 1
            assert batch["input_ids"].shape == (ROWS, seq) and lengths.max() <= seq
            assert (lengths[pairs] >= 5).all()


def test_text_batches_refuse_a_text_shorter_than_one_window():
    with pytest.raises(ValueError, match="fewer than one"):
        text_batches("classify", WordTokenizer(), max_seq_len=64, text="too short\nto calibrate on")


def test_the_calibration_text_is_plain_prose_of_our_own():
    text = CALIBRATION_TEXT.read_text(encoding="utf-8")
    assert text.isascii() and len(text.split()) > 2500
    assert len(WordTokenizer().tokenize_batch([text])[0]) > 8 * LONGEST
