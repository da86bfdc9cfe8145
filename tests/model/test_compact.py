"""Compact deltas rebuild the fine-tuned checkpoint: exactly at full rank, approximately below."""

from __future__ import annotations

import pytest
import torch

from model import bert
from model.compact import FP16_FILE, compress, rebuild, rebuild_fp16, store_fp16
from tests.helpers.tiny import tiny_config, write_tokenizer_files


def fine_tune_like(model: torch.nn.Module, seed: int = 0, scale: float = 0.01) -> None:
    """Perturb everything but the embedding tables, as a frozen-embedding fine-tune would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embeddings" not in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture
def base_and_tuned(tmp_path):
    torch.manual_seed(0)
    base_dir, tuned_dir = tmp_path / "base", tmp_path / "tuned"
    write_tokenizer_files(base_dir)
    bert.BertModel(tiny_config()).save_pretrained(base_dir, tokenizer_from=base_dir)
    tuned = bert.BertForSequenceClassification.from_pretrained(
        base_dir, task="classify", id2label={0: "neg", 1: "pos"}
    )
    fine_tune_like(tuned)
    tuned.save_pretrained(tuned_dir)
    return base_dir, tuned_dir, tuned


def outputs(model, seed=1):
    ids = torch.randint(5, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.eval()(ids).logits


@pytest.mark.parametrize("bits", [8, 16])
def test_full_rank_rebuild_matches(tmp_path, base_and_tuned, bits):
    base_dir, tuned_dir, tuned = base_and_tuned
    report = compress(tuned_dir, base_dir, tmp_path / "compact", rank=64, bits=bits)
    assert report["min_energy_kept"] > 0.999999
    rebuilt = bert.BertForSequenceClassification.from_pretrained(
        rebuild(tmp_path / "compact", tmp_path / "r", base_dir)
    )
    assert rebuilt.config.id2label == {0: "neg", 1: "pos"}
    assert (outputs(rebuilt) - outputs(tuned)).abs().max() < (2e-2 if bits == 8 else 2e-3)


def test_int8_factors_halve_the_size(tmp_path, base_and_tuned):
    base_dir, tuned_dir, _ = base_and_tuned
    fp16 = compress(tuned_dir, base_dir, tmp_path / "a", rank=16, bits=16)
    int8 = compress(tuned_dir, base_dir, tmp_path / "b", rank=16, bits=8)
    assert int8["bytes"] < 0.75 * fp16["bytes"]


def test_low_rank_is_smaller_and_approximate(tmp_path, base_and_tuned):
    base_dir, tuned_dir, tuned = base_and_tuned
    full = compress(tuned_dir, base_dir, tmp_path / "full", rank=64)
    low = compress(tuned_dir, base_dir, tmp_path / "low", rank=2)
    assert low["bytes"] < full["bytes"] / 2
    assert low["mean_energy_kept"] < 0.5  # random deltas are far from low rank
    rebuilt = bert.BertForSequenceClassification.from_pretrained(
        rebuild(tmp_path / "low", tmp_path / "r", base_dir)
    )
    assert (outputs(rebuilt) - outputs(tuned)).abs().max() > 1e-4


def test_rebuild_refuses_a_different_base(tmp_path, base_and_tuned):
    base_dir, tuned_dir, _ = base_and_tuned
    compress(tuned_dir, base_dir, tmp_path / "compact", rank=4)
    other = tmp_path / "other"
    write_tokenizer_files(other)
    bert.BertModel(tiny_config()).save_pretrained(other)
    with pytest.raises(ValueError, match="sha256"):
        rebuild(tmp_path / "compact", tmp_path / "r", other)


def test_changed_word_embeddings_are_refused(tmp_path):
    from model.config import BertConfig

    base_dir, tuned_dir = tmp_path / "base", tmp_path / "tuned"
    config = tiny_config(vocab_size=1500)
    bert.BertModel(config).save_pretrained(base_dir)
    tuned = bert.BertForSequenceClassification(BertConfig.from_pretrained(base_dir))
    tuned.save_pretrained(tuned_dir)
    with pytest.raises(ValueError, match="freeze-embeddings"):
        compress(tuned_dir, base_dir, tmp_path / "c", rank=4)


def test_fp16_store_rebuilds_the_fp16_weights_exactly_and_checks_their_hash(tmp_path, base_and_tuned):
    _, tuned_dir, tuned = base_and_tuned
    report = store_fp16(tuned_dir, tmp_path / "fp16")
    assert report["bytes"] < 0.55 * sum(p.numel() * 4 for p in tuned.parameters())
    rebuilt_dir = rebuild_fp16(tmp_path / "fp16", tmp_path / "r")
    rebuilt = bert.BertForSequenceClassification.from_pretrained(rebuilt_dir)
    assert rebuilt.config.id2label == {0: "neg", 1: "pos"}
    for key, value in tuned.state_dict().items():  # every weight is the fp16 value, widened
        assert torch.equal(rebuilt.state_dict()[key], value.half().float()), key
    assert (tmp_path / "r" / "vocab.txt").read_bytes() == (tuned_dir / "vocab.txt").read_bytes()
    stored = tmp_path / "fp16" / FP16_FILE
    data = stored.read_bytes()
    stored.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ValueError, match="sha256"):
        rebuild_fp16(tmp_path / "fp16", tmp_path / "r2")
