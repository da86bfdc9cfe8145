"""RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA and DistilBERT equal `transformers` on random tiny
configs: the checkpoint transformers writes loads into ours (model/architectures.py) and gives the
same encoder states, head outputs and losses, padded rows included; ours saves what transformers
loads back."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model.architectures import (  # noqa: E402
    ARCHITECTURES,
    MASKED_LM,
    UnsupportedArchitecture,
    architecture,
    head_type,
)
from model.bert import BertModel  # noqa: E402

TOL = 1e-5
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
VOCAB = 99
# model_type -> (transformers config class, its kwargs, pad id)
CONFIGS = {
    "roberta": ("RobertaConfig", dict(**SIZES, max_position_embeddings=40, type_vocab_size=1), 1),
    "xlm-roberta": ("XLMRobertaConfig", dict(**SIZES, max_position_embeddings=40, type_vocab_size=1), 1),
    "camembert": ("CamembertConfig", dict(**SIZES, max_position_embeddings=40, type_vocab_size=1), 1),
    "electra": ("ElectraConfig", dict(**SIZES, embedding_size=16, max_position_embeddings=40), 0),
    "distilbert": (
        "DistilBertConfig",
        dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=40),
        0,
    ),
}
HEADS = {  # our task -> transformers' class suffix
    "embed": "Model",
    "classify": "ForSequenceClassification",
    "ner": "ForTokenClassification",
    "qa": "ForQuestionAnswering",
    "multiple-choice": "ForMultipleChoice",
}


def hf_config(model_type: str, **extra):
    name, kwargs, pad = CONFIGS[model_type]
    return getattr(transformers, name)(**{"vocab_size": VOCAB, "pad_token_id": pad, **kwargs, **extra})


def hf_model(model_type: str, task: str, seed: int = 0, **extra):
    """A tiny transformers model, weights widened so that heads and rows differ."""
    torch.manual_seed(seed)
    cls = getattr(transformers, ARCHITECTURES[model_type].hf_name + HEADS[task])
    model = cls(hf_config(model_type, **extra)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                p.normal_(0.0, 0.2)
    return model


def padded_batch(model_type: str, batch: int = 3, seq: int = 13, seed: int = 0):
    """Right-padded rows with the architecture's pad id (RoBERTa's positions are read from it), and
    segment ids of a pair where the architecture has two types."""
    pad = CONFIGS[model_type][2]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate([seq, seq - 5, 3][:batch]):
        mask[row, length:] = 0
        ids[row, length:] = pad
    types = torch.zeros_like(ids)
    if model_type == "electra":
        types[:, seq // 2 :] = 1
    return ids, mask, types * mask


def labels_for(task: str, ids: torch.Tensor, num_labels: int) -> dict:
    b, s = ids.shape[0], ids.shape[-1]
    g = torch.Generator().manual_seed(1)
    if task == "classify":
        if num_labels == 1:
            return {"labels": torch.randn(b, generator=g)}
        return {"labels": torch.randint(0, num_labels, (b,), generator=g)}
    if task == "ner":
        labels = torch.randint(0, num_labels, (b, s), generator=g)
        labels[:, 0] = -100
        return {"labels": labels}
    if task == "qa":
        return {
            "start_positions": torch.tensor([1, 4, 99][:b]),
            "end_positions": torch.tensor([2, 6, 99][:b]),
        }
    if task == "multiple-choice":
        return {"labels": torch.tensor([2])}
    if task == MASKED_LM:
        labels = torch.full((b, s), -100)
        labels[:, 1] = ids[:, 1]
        return {"labels": labels}
    return {}


def compare(model_type: str, task: str, ours, theirs) -> None:
    ids, mask, types = padded_batch(model_type)
    if task == "multiple-choice":  # [batch, choices, seq]
        ids, mask, types = ids.view(1, 3, -1), mask.view(1, 3, -1), types.view(1, 3, -1)
    kwargs = labels_for(task, ids, ours.config.num_labels)
    if task == "ner":  # transformers does not mask padding itself
        kwargs["labels"] = kwargs["labels"].masked_fill(mask == 0, -100)
    their_inputs = {"input_ids": ids, "attention_mask": mask}
    if model_type != "distilbert":
        their_inputs["token_type_ids"] = types
    ours.eval()
    with torch.no_grad():
        a = ours(ids, mask, types, **kwargs)
        b = theirs(**their_inputs, **kwargs)
    if task == "embed":
        fields = [("last_hidden_state", "last_hidden_state")]
        if ARCHITECTURES[model_type].pooler:
            fields.append(("pooler_output", "pooler_output"))
    elif task == "qa":
        fields = [("start_logits", "start_logits"), ("end_logits", "end_logits"), ("loss", "loss")]
    else:
        fields = [("logits", "logits"), ("loss", "loss")]
    for ours_field, their_field in fields:
        x, y = getattr(a, ours_field), getattr(b, their_field)
        assert x.shape == y.shape, (ours_field, x.shape, y.shape)
        diff = (x - y).abs().max().item()
        assert diff <= TOL, f"{model_type} {task} {ours_field}: max abs diff {diff}"


@pytest.mark.parametrize("task", list(HEADS))
@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_transformers_checkpoint_loads_into_ours_and_matches(tmp_path, model_type, task):
    theirs = hf_model(model_type, task, **({"num_labels": 3} if task in ("classify", "ner") else {}))
    theirs.save_pretrained(tmp_path)
    cls = BertModel if task == "embed" else head_type(model_type, task)
    ours = cls.from_pretrained(tmp_path)
    assert ours.missing_keys == [] and ours.unexpected_keys == [], (ours.missing_keys, ours.unexpected_keys)
    assert ours.config.model_type == model_type
    compare(model_type, task, ours, theirs)


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_one_output_cross_encoder_regression_matches(tmp_path, model_type):
    """A reranker such as bge-reranker (XLM-R) has one logit: MSE loss, as transformers."""
    theirs = hf_model(model_type, "classify", num_labels=1)
    theirs.save_pretrained(tmp_path)
    ours = head_type(model_type, "classify").from_pretrained(tmp_path)
    compare(model_type, "classify", ours, theirs)


@pytest.mark.parametrize("task", ["classify", "ner", "multiple-choice"])
@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_ours_saves_what_transformers_loads(tmp_path, model_type, task):
    """The other direction: our weights under their names and config keys."""
    source = hf_model(model_type, task, seed=1)
    source.save_pretrained(tmp_path / "a")
    ours = head_type(model_type, task).from_pretrained(tmp_path / "a")
    ours.save_pretrained(tmp_path / "b")
    saved = json.loads((tmp_path / "b" / "config.json").read_text())
    assert saved["model_type"] == model_type
    assert saved["architectures"] == [ARCHITECTURES[model_type].hf_name + HEADS[task]]
    if model_type == "distilbert":
        assert saved["dim"] == 32 and "hidden_size" not in saved and "type_vocab_size" not in saved
    theirs = type(source).from_pretrained(tmp_path / "b").eval()
    compare(model_type, task, ours, theirs)


def test_roberta_positions_skip_padding_wherever_it_sits(tmp_path):
    """Left padding moves RoBERTa's positions with the row: a left-padded row equals itself unpadded."""
    hf_model("roberta", "embed").save_pretrained(tmp_path)
    ours = BertModel.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    left = torch.tensor([[1, 1, 0, 5, 6, 7, 2]])
    with torch.no_grad():
        alone = ours(ids).last_hidden_state
        padded = ours(left, (left != 1).long()).last_hidden_state
    assert (alone - padded[:, 2:]).abs().max() <= TOL


@pytest.mark.parametrize(
    "model_type, words",
    [
        ("deberta-v2", "disentangled relative-position attention"),
        ("nomic_bert", "NomicBERT"),
        ("qwen2", "decoder language models"),
        ("t5", "not implemented"),
    ],
)
def test_refused_model_types_name_themselves_and_what_serves(tmp_path, model_type, words):
    with pytest.raises(UnsupportedArchitecture) as error:
        architecture(model_type, "ckpt")
    message = str(error.value)
    assert f"model_type {model_type!r}" in message and words in message
    assert "roberta, xlm-roberta" in message and "docs/models.md" in message
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(ValueError, match=f"model_type {model_type!r}"):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "camembert", "distilbert"])
def test_masked_lm_heads_match_both_ways(tmp_path, model_type):
    """The masked-LM head (its decoder tied to the word embeddings), for sparse vectors: transformers'
    checkpoint loads into ours and ours saves what transformers loads."""
    torch.manual_seed(0)
    cls = getattr(transformers, ARCHITECTURES[model_type].hf_name + "ForMaskedLM")
    theirs = cls(hf_config(model_type)).eval()
    theirs.save_pretrained(tmp_path / "a")
    ours = head_type(model_type, MASKED_LM).from_pretrained(tmp_path / "a")
    assert ours.missing_keys == [] and ours.unexpected_keys == [], (ours.missing_keys, ours.unexpected_keys)
    compare(model_type, MASKED_LM, ours, theirs)
    ours.save_pretrained(tmp_path / "b")
    compare(model_type, MASKED_LM, ours, cls.from_pretrained(tmp_path / "b").eval())


def test_an_architecture_without_a_masked_lm_head_says_so():
    with pytest.raises(UnsupportedArchitecture, match="'electra' has no masked-lm head"):
        head_type("electra", MASKED_LM)


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "camembert", "distilbert"])
def test_sparse_heads_are_splade_over_transformers_masked_lm_logits(tmp_path, model_type):
    """/embed_sparse's head on each architecture with a masked-LM head: max over a row's real tokens
    of log(1 + relu(logit)), the logits transformers' own ForMaskedLM gives on the same checkpoint."""
    torch.manual_seed(0)
    theirs = getattr(transformers, ARCHITECTURES[model_type].hf_name + "ForMaskedLM")(hf_config(model_type))
    theirs.eval().save_pretrained(tmp_path)
    ours = head_type(model_type, "sparse").from_pretrained(tmp_path, task="sparse").eval()
    ids, mask, _ = padded_batch(model_type)
    with torch.no_grad():
        logits = theirs(input_ids=ids, attention_mask=mask).logits  # (B, T, vocab)
        expected = (torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1)).amax(dim=1)  # (B, vocab)
        got = ours(ids, mask).sparse
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=TOL)


def test_sparse_vectors_need_a_masked_lm_head():
    with pytest.raises(UnsupportedArchitecture, match="'electra' has no masked-LM head"):
        head_type("electra", "sparse")
