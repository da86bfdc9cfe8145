"""Our ModernBERT equals `transformers`' on checkpoints it saved: the encoder and every head it ships,
with local and global layers, both rotary bases, and sequences longer than the local window."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import modernbert  # noqa: E402

TOL = 1e-5
HEADS = [
    "ModernBertModel",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertForMultipleChoice",
    "ModernBertForQuestionAnswering",
    "ModernBertForMaskedLM",
]


def hf_config(**overrides):
    sizes = dict(
        vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
        sep_token_id=2, local_attention=16, global_attn_every_n_layers=3, num_labels=3,
        attn_implementation="eager",
    )  # fmt: skip
    return transformers.ModernBertConfig(**{**sizes, **overrides})


def widened(model, seed: int = 0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 and "embeddings" not in name else 0.1)
    return model.eval()


def padded(batch: int = 3, seq: int = 40, seed: int = 0):
    # 40 tokens: far beyond the local window of 16 (8 each side).
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 120, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate([seq, seq - 13, 5][:batch]):
        mask[row, length:] = 0
        ids[row, length:] = 0
    return ids, mask


CASES = [(name, "cls") for name in HEADS] + [
    ("ModernBertForSequenceClassification", "mean"),
    ("ModernBertForMultipleChoice", "mean"),
]


@pytest.mark.parametrize(("name", "pooling"), CASES)
def test_modernbert_matches_transformers_on_its_saved_checkpoint(name, pooling, tmp_path):
    labels = 2 if name == "ModernBertForQuestionAnswering" else 3
    theirs = widened(getattr(transformers, name)(hf_config(num_labels=labels, classifier_pooling=pooling)))
    theirs.save_pretrained(tmp_path)
    ours = getattr(modernbert, name).from_pretrained(tmp_path).eval()
    assert ours.missing_keys == [] and ours.unexpected_keys == []
    assert ours.config.layer_types == theirs.config.layer_types  # global, local, local, global
    ids, mask = padded()
    if name == "ModernBertForMultipleChoice":
        ids, mask = ids.view(1, 3, -1), mask.view(1, 3, -1)  # [batch 1, 3 choices, seq]
    with torch.no_grad():
        a, b = ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
    if name == "ModernBertModel":
        pairs = [(a.last_hidden_state, b.last_hidden_state)]
    elif name == "ModernBertForQuestionAnswering":
        pairs = [(a.start_logits, b.start_logits), (a.end_logits, b.end_logits)]
    else:
        pairs = [(a.logits, b.logits)]
    for x, y in pairs:
        if x.dim() >= 2 and x.shape[:2] == mask.shape:  # token outputs: real tokens only
            x, y = x[mask.bool()], y[mask.bool()]
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, atol=TOL, rtol=0)


def test_older_configs_name_the_period_and_the_two_bases(tmp_path):
    config = modernbert.ModernBertConfig.from_dict(
        {"model_type": "modernbert", "num_hidden_layers": 5, "global_attn_every_n_layers": 2,
         "global_rope_theta": 80000.0, "local_rope_theta": 5000.0, "hidden_size": 32,
         "num_attention_heads": 4}
    )  # fmt: skip
    assert config.layer_types == ["full_attention", "sliding_attention"] * 2 + ["full_attention"]
    assert config.rope_theta("full_attention") == 80000.0 and config.rope_theta("sliding_attention") == 5000.0
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        modernbert.ModernBertConfig(
            hidden_size=32, num_attention_heads=4, rope_parameters={"full_attention": {"rope_type": "yarn"}}
        )


def test_the_local_window_is_what_separates_local_from_global_layers():
    """A key farther than half the window from a query changes a local layer's answer only through
    the global layers: with every layer local, the first token ignores a change at position 30."""
    config = modernbert.ModernBertConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        pad_token_id=0, local_attention=16, layer_types=["sliding_attention"] * 2,
    )  # fmt: skip
    model = widened(modernbert.ModernBertModel(config))
    ids = torch.randint(3, 50, (1, 40), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 30] = 3 if ids[0, 30] != 3 else 4
    with torch.no_grad():
        a, b = model(ids).last_hidden_state, model(changed).last_hidden_state
    assert torch.equal(a[0, 0], b[0, 0])  # 2 layers x 8 tokens each side reach position 16, not 30
    assert not torch.equal(a[0, 29], b[0, 29])


def test_sentence_embedding_and_sparse_heads_on_the_masked_lm_checkpoint(tmp_path):
    theirs = widened(transformers.ModernBertForMaskedLM(hf_config()))
    theirs.save_pretrained(tmp_path)
    ids, mask = padded()
    embed = modernbert.ModernBertForSentenceEmbedding.from_pretrained(tmp_path, pooling="cls").eval()
    sparse = modernbert.ModernBertForSparseEmbedding.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        hidden = theirs.model(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = theirs(input_ids=ids, attention_mask=mask).logits
        vectors, weights = embed(ids, mask).embeddings, sparse(ids, mask).sparse
    torch.testing.assert_close(vectors, hidden[:, 0], atol=TOL, rtol=0)
    expected = (torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1)).max(dim=1).values
    torch.testing.assert_close(weights, expected, atol=TOL, rtol=0)
