"""Our MPNet equals `transformers`' on checkpoints it saved: the encoder and every head it ships."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import mpnet  # noqa: E402

TOL = 1e-5
# ours -> transformers'
PAIRS = {
    "MPNetModel": "MPNetModel",
    "MPNetForSequenceClassification": "MPNetForSequenceClassification",
    "MPNetForTokenClassification": "MPNetForTokenClassification",
    "MPNetForMultipleChoice": "MPNetForMultipleChoice",
    "MPNetForQuestionAnswering": "MPNetForQuestionAnswering",
    "MPNetForMaskedLM": "MPNetForMaskedLM",
}


def hf_config(**overrides):
    sizes = dict(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=300,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    return transformers.MPNetConfig(**{**sizes, **overrides})


def widened(model, seed: int = 0):
    """std 0.02 weights give near-uniform outputs: widen them so a wrong wire shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 and "embeddings" not in name else 0.1)
    return model.eval()


def padded(vocab: int, batch: int = 3, seq: int = 150, seed: int = 0):
    # 150 tokens: relative distances reach past max_distance 128 (the logarithmic buckets' clamp).
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate([seq, seq - 40, 5][:batch]):
        mask[row, length:] = 0
        ids[row, length:] = 1  # <pad>: position ids skip it
    return ids, mask


@pytest.mark.parametrize("ours_name", sorted(PAIRS))
def test_mpnet_matches_transformers_on_its_saved_checkpoint(ours_name, tmp_path):
    labels = 2 if ours_name == "MPNetForQuestionAnswering" else 3  # QA: start and end
    theirs = widened(getattr(transformers, PAIRS[ours_name])(hf_config(num_labels=labels)))
    theirs.save_pretrained(tmp_path)
    ours = getattr(mpnet, ours_name).from_pretrained(tmp_path).eval()
    assert ours.missing_keys == [] and ours.unexpected_keys == []
    ids, mask = padded(120)
    if ours_name == "MPNetForMultipleChoice":
        ids, mask = ids.view(1, 3, -1), mask.view(1, 3, -1)  # [batch 1, 3 choices, seq]
    with torch.no_grad():
        a, b = ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
    if ours_name == "MPNetModel":
        pairs = [(a.last_hidden_state, b.last_hidden_state), (a.pooler_output, b.pooler_output)]
    elif ours_name == "MPNetForQuestionAnswering":
        pairs = [(a.start_logits, b.start_logits), (a.end_logits, b.end_logits)]
    else:
        pairs = [(a.logits, b.logits)]
    for x, y in pairs:
        real = mask.bool() if x.dim() >= 2 and x.shape[:2] == mask.shape else None
        if real is not None:  # padding positions are never read
            x, y = x[real], y[real]
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, atol=TOL, rtol=0)


def test_buckets_cover_both_directions_and_clamp_far_distances():
    relative = torch.tensor([-300, -128, -9, -8, -1, 0, 1, 7, 8, 127, 128, 300])
    ours = mpnet.relative_position_bucket(relative)
    theirs = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(relative)
    assert ours.tolist() == theirs.tolist()
    assert ours.max() == 31 and ours.min() == 0


def test_sentence_embedding_and_sparse_heads_share_the_encoder_weights(tmp_path):
    theirs = widened(transformers.MPNetForMaskedLM(hf_config()))
    theirs.save_pretrained(tmp_path)
    ids, mask = padded(120)
    embed = mpnet.MPNetForSentenceEmbedding.from_pretrained(tmp_path, pooling="mean").eval()
    sparse = mpnet.MPNetForSparseEmbedding.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        hidden = theirs.mpnet(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = theirs(input_ids=ids, attention_mask=mask).logits
        vectors = embed(ids, mask).embeddings
        weights = sparse(ids, mask).sparse
    m = mask.unsqueeze(-1).float()
    torch.testing.assert_close(vectors, (hidden * m).sum(1) / m.sum(1), atol=TOL, rtol=0)
    expected = (torch.log1p(torch.relu(logits)) * m).max(dim=1).values
    torch.testing.assert_close(weights, expected, atol=TOL, rtol=0)
