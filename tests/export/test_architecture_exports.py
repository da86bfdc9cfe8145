"""RoBERTa, XLM-RoBERTa, ELECTRA and DistilBERT checkpoints written by `transformers` export with
every variant, for every head, through the CLI; the fp32 and fused graphs equal the `transformers`
model at shapes the export never traced (padding with the model's own pad id), the INT8 variants pass
the same checks as BERT's, and what we refuse is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export.__main__ import main
from export.bundle import load_bundle_manifest
from export.pipeline import VARIANTS
from model.tiny import write_tokenizer
from tests.model.test_architectures import CONFIGS, HEADS, hf_model

from .test_export import FP32_TOL, ort_outputs

transformers = pytest.importorskip("transformers")

TOKENIZERS = {"roberta": "bpe", "xlm-roberta": "unigram", "electra": "wordpiece", "distilbert": "wordpiece"}
TASKS = ("classify", "ner", "qa", "multiple-choice", "embed")
MAX_SEQ_LEN = 32
SHAPES = [(1, 1), (4, MAX_SEQ_LEN), (6, 13), (2, 31)]


def checkpoint(model_type: str, task: str, directory):
    """What a user's script leaves: model.save_pretrained beside the tokenizer files."""
    vocab = write_tokenizer(directory, TOKENIZERS[model_type])
    labels = {"num_labels": 3} if task in ("classify", "ner") else {}
    model = hf_model(model_type, task, vocab_size=vocab, **labels)
    model.save_pretrained(directory)
    return model


def inputs(model_type: str, task: str, batch: int, seq: int, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (batch, 3, seq) if task == "multiple-choice" else (batch, seq)
    lengths = rng.integers(1, seq + 1, size=shape[:-1])
    lengths.flat[0] = seq
    mask = (np.arange(seq) < lengths[..., None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(3, 99, size=shape), CONFIGS[model_type][2]).astype(np.int64)
    types = ((np.arange(seq) >= lengths[..., None] // 2) & (mask == 1)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def reference(model, model_type: str, task: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    given = {k: torch.from_numpy(v) for k, v in feeds.items()}
    if model_type != "electra":  # one token type (RoBERTa) or none (DistilBERT): their tokenizers give none
        del given["token_type_ids"]
    with torch.no_grad():
        out = model(**given)
    if task == "qa":
        return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}
    if task == "embed":
        return {"last_hidden_state": out.last_hidden_state.numpy()}
    return {"logits": out.logits.numpy()}


def worst(task: str, ref: dict, got: dict, mask: np.ndarray) -> float:
    per_token = task in ("ner", "qa", "embed")
    return max(
        float(np.abs((got[k] - v)[mask.astype(bool)] if per_token else got[k] - v).max())
        for k, v in ref.items()
    )


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("model_type", list(TOKENIZERS))
def test_transformers_checkpoint_exports_every_variant_and_matches(tmp_path, model_type, task):
    model = checkpoint(model_type, task, tmp_path / "checkpoint")
    bundle = tmp_path / "bundle"
    assert (
        main([str(tmp_path / "checkpoint"), str(bundle), "--max-seq-len", str(MAX_SEQ_LEN), "--quiet"]) == 0
    )
    manifest = load_bundle_manifest(bundle)
    assert manifest.task == task and sorted(manifest.variants) == sorted(VARIANTS)
    assert manifest.model["model_type"] == model_type
    assert manifest.verification["int8-rowwise"]["batch_invariance"]["invariant"]
    assert manifest.verification["fp16"]["passed"] in (True, None)
    for batch, seq in SHAPES:
        feeds = inputs(model_type, task, batch, seq)
        ref = reference(model, model_type, task, feeds)
        for variant in ("fp32", "fused"):
            got = ort_outputs(bundle, variant, {k: feeds[k] for k in manifest.input_names})
            assert worst(task, ref, got, feeds["attention_mask"]) <= FP32_TOL, (variant, batch, seq)
        got = ort_outputs(bundle, "int8-rowwise", {k: feeds[k] for k in manifest.input_names})
        scale = max(1.0, *(float(np.abs(v).max()) for v in ref.values()))
        assert worst(task, ref, got, feeds["attention_mask"]) <= 0.1 * scale, (batch, seq)


def test_roberta_max_seq_len_stops_at_its_usable_positions(tmp_path, capsys):
    checkpoint("roberta", "classify", tmp_path / "checkpoint")  # 40 positions, padding index 1: 38 tokens
    assert main([str(tmp_path / "checkpoint"), str(tmp_path / "b"), "--max-seq-len", "39", "--quiet"]) == 1
    error = capsys.readouterr().err
    assert "max_seq_len 39 must be in [2, 38]" in error and "positions RoBERTa skips" in error
    assert main([str(tmp_path / "checkpoint"), str(tmp_path / "b"), "--variants", "fp32", "--quiet"]) == 0
    assert load_bundle_manifest(tmp_path / "b").max_seq_len == 38


def test_a_tokenizer_that_pads_otherwise_than_the_model_is_refused(tmp_path, capsys):
    checkpoint("roberta", "classify", tmp_path / "checkpoint")
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**config, "pad_token_id": 0}))
    assert main([str(tmp_path / "checkpoint"), str(tmp_path / "b"), "--max-seq-len", "16", "--quiet"]) == 1
    assert "pads with id 1 but config.json has pad_token_id 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "model_type, words",
    [("deberta-v2", "DeBERTa-v2"), ("nomic_bert", "NomicBERT"), ("qwen3", "decoder language models")],
)
def test_unsupported_model_types_are_refused_by_name(tmp_path, capsys, model_type, words):
    checkpoint("electra", "classify", tmp_path / "checkpoint")
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    assert main([str(tmp_path / "checkpoint"), str(tmp_path / "b"), "--quiet"]) == 1
    error = capsys.readouterr().err
    assert f"model_type {model_type!r}" in error and words in error and "docs/models.md" in error
    assert not (tmp_path / "b").exists()


def test_head_names_of_every_architecture_pick_the_task():
    from export.onnx_export import ARCHITECTURE_TASKS

    for model_type in TOKENIZERS:
        stems = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "electra": "Electra"}
        for task, suffix in HEADS.items():
            assert ARCHITECTURE_TASKS[stems.get(model_type, "DistilBert") + suffix] == task
