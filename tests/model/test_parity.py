"""Our BERT equals `transformers` on the same weights: encoder, every head, losses, round trips."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import bert  # noqa: E402
from model.checkpoint import minilm_package_dir  # noqa: E402
from tests.helpers.tiny import make_tiny_checkpoint, tiny_config, write_tokenizer_files  # noqa: E402

TOL = 1e-5
PAIRS = {
    "BertModel": "BertModel",
    "BertForSequenceClassification": "BertForSequenceClassification",
    "BertForTokenClassification": "BertForTokenClassification",
    "BertForMultipleChoice": "BertForMultipleChoice",
    "BertForQuestionAnswering": "BertForQuestionAnswering",
    "BertForPreTraining": "BertForPreTraining",
    "BertForMaskedLM": "BertForMaskedLM",
    "BertForNextSentencePrediction": "BertForNextSentencePrediction",
}


def padded_batch(vocab: int, batch: int = 3, seq: int = 13, with_types: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate([seq, seq - 5, 3][:batch]):
        mask[row, length:] = 0
        ids[row, length:] = 0
    types = None
    if with_types:
        types = torch.zeros_like(ids)
        types[:, seq // 2 :] = 1
        types = types * mask
    return ids, mask, types


def labels_for(name: str, ids: torch.Tensor, config) -> dict:
    b, s = ids.shape[0], ids.shape[-1]
    g = torch.Generator().manual_seed(1)
    if name == "BertForSequenceClassification":
        if config.num_labels == 1:
            return {"labels": torch.randn(b, generator=g)}
        return {"labels": torch.randint(0, config.num_labels, (b,), generator=g)}
    if name == "BertForTokenClassification":
        labels = torch.randint(0, config.num_labels, (b, s), generator=g)
        labels[:, 0] = -100
        return {"labels": labels}
    if name == "BertForQuestionAnswering":
        # one gold position out of range: both implementations clamp and ignore it
        starts, ends = torch.tensor([1, 4, 99][:b]), torch.tensor([2, 6, 99][:b])
        return {"start_positions": starts, "end_positions": ends}
    if name == "BertForMultipleChoice":
        return {"labels": torch.tensor([0, 1, 0][:b])}
    if name == "BertForPreTraining":
        labels = torch.full((b, s), -100)
        labels[:, 2] = ids[:, 2]
        return {"labels": labels, "next_sentence_label": torch.tensor([0, 1, 1][:b])}
    if name == "BertForMaskedLM":
        labels = torch.full((b, s), -100)
        labels[:, 1] = ids[:, 1]
        return {"labels": labels}
    if name == "BertForNextSentencePrediction":
        return {"labels": torch.tensor([0, 1, 0][:b])}
    return {}


def assert_same_outputs(name, ours, theirs, ids, mask, types, with_labels: bool):
    ours.eval()
    theirs.eval()
    if name == "BertForMultipleChoice":  # [batch, choices, seq]
        ids, mask = ids.view(1, 3, -1), mask.view(1, 3, -1)
        types = types.view(1, 3, -1) if types is not None else None
    kwargs = labels_for(name, ids[0] if name == "BertForMultipleChoice" else ids, ours.config)
    if name == "BertForTokenClassification":  # transformers does not mask padding itself
        kwargs["labels"] = kwargs["labels"].masked_fill(mask == 0, -100)
    if name == "BertForMultipleChoice":
        kwargs = {"labels": torch.tensor([2])}
    if not with_labels:
        kwargs = {}
    with torch.no_grad():
        a = ours(ids, mask, types, **kwargs)
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, **kwargs)
    pairs = {
        "BertModel": [("last_hidden_state", "last_hidden_state"), ("pooler_output", "pooler_output")],
        "BertForQuestionAnswering": [("start_logits", "start_logits"), ("end_logits", "end_logits")],
        "BertForPreTraining": [
            ("prediction_logits", "prediction_logits"),
            ("seq_relationship_logits", "seq_relationship_logits"),
        ],
    }.get(name, [("logits", "logits")])
    if with_labels and name != "BertModel":
        pairs = pairs + [("loss", "loss")]
    for ours_field, their_field in pairs:
        x, y = getattr(a, ours_field), getattr(b, their_field)
        diff = (x - y).abs().max().item()
        assert diff <= TOL, f"{name}.{ours_field}: max abs diff {diff}"


@pytest.mark.parametrize("name", list(PAIRS))
@pytest.mark.parametrize("with_types", [True, False])
def test_tiny_heads_match_transformers(tmp_path, name, with_types):
    """We save; transformers loads the same directory; outputs and losses agree."""
    config = tiny_config(id2label={0: "a", 1: "b", 2: "c"})
    torch.manual_seed(0)
    ours = getattr(bert, name)(config)
    write_tokenizer_files(tmp_path)
    ours.save_pretrained(tmp_path, tokenizer_from=tmp_path)
    theirs = getattr(transformers, PAIRS[name]).from_pretrained(tmp_path)
    ids, mask, types = padded_batch(config.vocab_size, with_types=with_types)
    assert_same_outputs(name, ours, theirs, ids, mask, types, with_labels=True)


def test_regression_head_uses_mse_like_transformers(tmp_path):
    config = tiny_config(id2label={0: "score"})
    ours = bert.BertForSequenceClassification(config)
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    ids, mask, types = padded_batch(config.vocab_size)
    assert_same_outputs("BertForSequenceClassification", ours, theirs, ids, mask, types, with_labels=True)


def test_transformers_saves_we_load(tmp_path):
    """The other direction: a transformers checkpoint (BertForSequenceClassification) loads into ours."""
    hf_config = transformers.BertConfig(**{k: v for k, v in tiny_config().to_dict().items() if k != "task"})
    torch.manual_seed(3)
    theirs = transformers.BertForSequenceClassification(hf_config).eval()
    theirs.save_pretrained(tmp_path)
    ours = bert.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert ours.missing_keys == [] and ours.unexpected_keys == []
    ids, mask, types = padded_batch(hf_config.vocab_size)
    assert_same_outputs("BertForSequenceClassification", ours, theirs, ids, mask, types, with_labels=True)


@pytest.mark.parametrize("act", ["gelu_new", "relu"])
def test_selectable_activations_match(tmp_path, act):
    config = tiny_config(hidden_act=act)
    ours = bert.BertModel(config)
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertModel.from_pretrained(tmp_path)
    ids, mask, types = padded_batch(config.vocab_size)
    assert_same_outputs("BertModel", ours, theirs, ids, mask, types, with_labels=False)


@pytest.mark.slow
@pytest.mark.parametrize("with_types", [True, False])
def test_real_minilm_encoder_matches(with_types):
    directory = minilm_package_dir()
    ours = bert.BertModel.from_pretrained(directory)
    theirs = transformers.BertModel.from_pretrained(directory)
    ids, mask, types = padded_batch(ours.config.vocab_size, seq=40, with_types=with_types)
    assert_same_outputs("BertModel", ours, theirs, ids, mask, types, with_labels=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering"]
)
def test_real_minilm_heads_match(tmp_path, name):
    """MiniLM body + a fresh head, saved by us and loaded by transformers."""
    torch.manual_seed(0)
    ours = getattr(bert, name).from_pretrained(minilm_package_dir(), id2label={0: "x", 1: "y", 2: "z"})
    ours.save_pretrained(tmp_path)
    theirs = getattr(transformers, name).from_pretrained(tmp_path)
    ids, mask, types = padded_batch(ours.config.vocab_size, seq=24)
    assert_same_outputs(name, ours, theirs, ids, mask, types, with_labels=True)


def test_token_classification_loss_ignores_padding():
    config = tiny_config(id2label={0: "O", 1: "B-X"})
    model = bert.BertForTokenClassification(config).eval()
    ids, mask, types = padded_batch(config.vocab_size)
    labels = torch.ones_like(ids)
    with torch.no_grad():
        loss = model(ids, mask, types, labels=labels).loss
        explicit = model(ids, mask, types, labels=labels.masked_fill(mask == 0, -100)).loss
        unmasked = model(ids, torch.ones_like(mask), types, labels=labels).loss
    assert torch.allclose(loss, explicit)
    assert not torch.allclose(loss, unmasked)


def test_position_embeddings_extend_past_trained_length(tmp_path):
    config = tiny_config(max_position_embeddings=16)
    bert.BertModel(config).save_pretrained(tmp_path)
    longer = bert.BertModel.from_pretrained(tmp_path, max_position_embeddings=40)
    table = longer.embeddings.position_embeddings.weight
    assert table.shape[0] == 40
    assert torch.equal(table[16:32], table[:16]) and torch.equal(table[32:40], table[:8])


def test_legacy_names_unprefixed_and_pickle_free_bin(tmp_path):
    """gamma/beta names, no `bert.` prefix, pytorch_model.bin loaded with weights_only."""
    config = tiny_config()
    source = bert.BertModel(config).eval()
    state = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in source.state_dict().items()
    }
    state["embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]
    config.save_pretrained(tmp_path)
    torch.save(state, tmp_path / "pytorch_model.bin")
    head = bert.BertForSequenceClassification.from_pretrained(tmp_path)
    assert head.missing_keys == ["classifier.weight", "classifier.bias"]
    assert head.unexpected_keys == []
    for key, value in source.state_dict().items():
        assert torch.equal(head.bert.state_dict()[key], value), key


def test_shape_mismatch_is_reported(tmp_path):
    bert.BertModel(tiny_config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="word_embeddings"):
        bert.BertModel.from_pretrained(tmp_path, vocab_size=999)


def test_tiny_checkpoint_round_trips_through_our_loader(tmp_path):
    make_tiny_checkpoint("ner", tmp_path)
    model = bert.BertForTokenClassification.from_pretrained(tmp_path)
    assert model.config.task == "ner" and model.config.id2label[1] == "B-PER"
    assert model.missing_keys == []
