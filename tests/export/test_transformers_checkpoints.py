"""Checkpoints written by `transformers` itself export without edits and match it.

The head comes from config.json `architectures` (or --task), the labels from `id2label`, regression
from `problem_type` / one label. Reference outputs come from the `transformers` model that wrote
the checkpoint, at shapes the export never traced: fp32 and fused graphs within 1e-4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from export.__main__ import main
from export.bundle import load_bundle_manifest
from tests.helpers.tiny import TASK_LABELS, tiny_sizes, write_tokenizer_files

from .test_export import FP32_TOL, NEW_SHAPES, diffs, fresh_inputs, ort_outputs

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
HF_HEADS = {
    "classify": "BertForSequenceClassification",
    "ner": "BertForTokenClassification",
    "multiple-choice": "BertForMultipleChoice",
    "qa": "BertForQuestionAnswering",
}
MAX_SEQ_LEN = 48


def hf_model(head: str, labels: list[str] | None = None, seed: int = 0, **config):
    """A tiny `transformers` model with weights wide enough that outputs differ between inputs."""
    kwargs = {**tiny_sizes(), **config}
    if labels:
        kwargs.update(id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    torch.manual_seed(seed)
    model = getattr(transformers, head)(transformers.BertConfig(**kwargs)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                p.normal_(0.0, 0.2)
    return model


def save_with_tokenizer(model, directory: Path, **save_kwargs) -> Path:
    """What a user's script does: model.save_pretrained + tokenizer.save_pretrained."""
    write_tokenizer_files(directory.parent / "vocab")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(directory.parent / "vocab" / "vocab.txt"))
    model.save_pretrained(directory, **save_kwargs)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for task, head in HF_HEADS.items():
        model = hf_model(head, TASK_LABELS[task])
        out[task] = (model, save_with_tokenizer(model, root / task / "checkpoint"))
    return out


def hf_outputs(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    if hasattr(out, "start_logits"):
        return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}
    return {"logits": out.logits.numpy()}


def assert_matches_transformers(model, task: str, bundle: Path, variants=("fp32", "fused")) -> None:
    for batch, seq in NEW_SHAPES:
        feeds = fresh_inputs(task, batch, min(seq, MAX_SEQ_LEN))
        ref = hf_outputs(model, feeds)
        for variant in variants:
            got = ort_outputs(bundle, variant, feeds)
            worst, _, _ = diffs(task, ref, got, feeds["attention_mask"])
            assert worst <= FP32_TOL, (task, variant, batch, seq, worst)


def export_cli(checkpoint: Path | str, out: Path, *extra: str) -> int:
    return main([str(checkpoint), str(out), "--max-seq-len", str(MAX_SEQ_LEN), "--quiet", *extra])


@pytest.mark.parametrize("task", list(HF_HEADS))
def test_transformers_checkpoint_exports_as_saved_and_matches(hf_checkpoints, task, tmp_path):
    model, checkpoint = hf_checkpoints[task]
    assert "task" not in json.loads((checkpoint / "config.json").read_text())  # nothing hand-added
    # One head goes through every default variant; the others only the fp32 graphs they are judged on.
    variants = [] if task == "ner" else ["--variants", "fp32,fused"]
    assert export_cli(checkpoint, tmp_path / "bundle", *variants) == 0
    manifest = load_bundle_manifest(tmp_path / "bundle")
    assert manifest.task == task and manifest.labels == TASK_LABELS[task]
    assert manifest.problem_type == ("single_label_classification" if task == "classify" else None)
    assert "tokenizer.json" in manifest.tokenizer_files and manifest.do_lower_case is True
    assert_matches_transformers(model, task, tmp_path / "bundle")


def edit_config(checkpoint: Path, **changes) -> None:
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def test_a_checkpoint_whose_task_cannot_be_told_names_the_field_and_the_flag(
    hf_checkpoints, tmp_path, capsys
):
    import shutil

    model, source = hf_checkpoints["classify"]
    checkpoint = Path(shutil.copytree(source, tmp_path / "no-architectures"))
    edit_config(checkpoint, architectures=None)
    assert export_cli(checkpoint, tmp_path / "b") == 1
    error = capsys.readouterr().err
    assert "`architectures` is absent" in error and "pass --task" in error and not (tmp_path / "b").exists()
    assert export_cli(checkpoint, tmp_path / "b", "--task", "classify", "--variants", "fp32") == 0
    assert_matches_transformers(model, "classify", tmp_path / "b", variants=("fp32",))
    # --task cannot contradict what the checkpoint says it is.
    assert export_cli(source, tmp_path / "c", "--task", "ner") == 1
    assert "not --task ner" in capsys.readouterr().err
    # A bare encoder is a sentence encoder (tests/export/test_sentence_encoder.py): exported as
    # another task, its missing head is refused, not randomised.
    encoder = save_with_tokenizer(hf_model("BertModel"), tmp_path / "encoder" / "checkpoint")
    assert export_cli(encoder, tmp_path / "d", "--task", "qa") == 1
    assert "says the head is for ['embed'] (architectures ['BertModel']" in capsys.readouterr().err
    edit_config(encoder, architectures=None)
    assert export_cli(encoder, tmp_path / "d", "--task", "qa") == 1
    assert "weights missing for qa_outputs" in capsys.readouterr().err


def test_regression_and_unsupported_configs(tmp_path, capsys):
    one_label = save_with_tokenizer(
        hf_model("BertForSequenceClassification", num_labels=1), tmp_path / "sts" / "checkpoint"
    )
    assert export_cli(one_label, tmp_path / "sts-bundle", "--variants", "fp32") == 0
    manifest = load_bundle_manifest(tmp_path / "sts-bundle")
    assert manifest.problem_type == "regression" and manifest.labels == ["LABEL_0"]

    multi = hf_model(
        "BertForSequenceClassification", ["a", "b", "c"], problem_type="multi_label_classification"
    )
    multi_dir = save_with_tokenizer(multi, tmp_path / "multi" / "checkpoint")
    assert export_cli(multi_dir, tmp_path / "multi-bundle") == 1
    assert "multi_label_classification" in capsys.readouterr().err
    edit_config(multi_dir, problem_type="regression")
    assert export_cli(multi_dir, tmp_path / "multi-bundle") == 1
    assert "problem_type 'regression' with 3 outputs" in capsys.readouterr().err
    edit_config(multi_dir, problem_type=None, model_type="deberta-v2")  # more in test_architecture_exports
    assert export_cli(multi_dir, tmp_path / "multi-bundle") == 1
    assert "model_type 'deberta-v2'" in capsys.readouterr().err


def test_legacy_google_names_and_sharded_weights(hf_checkpoints, tmp_path):
    """TF-era names (LayerNorm gamma/beta, no `bert.` prefix) in a pytorch_model.bin, and weights
    split into shards with an index, as save_pretrained writes big models."""
    model, source = hf_checkpoints["ner"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (legacy / name).write_bytes((source / name).read_bytes())
    state = {
        key.removeprefix("bert.")
        .replace("LayerNorm.weight", "LayerNorm.gamma")
        .replace("LayerNorm.bias", "LayerNorm.beta"): value
        for key, value in model.state_dict().items()
    }
    assert any(k.endswith("gamma") for k in state) and not any(k.startswith("bert.") for k in state)
    torch.save(state, legacy / "pytorch_model.bin")
    assert export_cli(legacy, tmp_path / "legacy-bundle", "--variants", "fp32") == 0
    assert_matches_transformers(model, "ner", tmp_path / "legacy-bundle", variants=("fp32",))

    sharded = save_with_tokenizer(model, tmp_path / "sharded" / "checkpoint", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists() and not (
        sharded / "model.safetensors"
    ).exists()
    assert export_cli(sharded, tmp_path / "sharded-bundle", "--variants", "fp32") == 0
    assert_matches_transformers(model, "ner", tmp_path / "sharded-bundle", variants=("fp32",))


def test_hub_id_resolves_through_the_hub_cache(hf_checkpoints, tmp_path, monkeypatch, capsys):
    """The real hub code path (huggingface_hub.snapshot_download) on a local directory laid out as the
    hub cache, offline: nothing can be downloaded here."""
    model, source = hf_checkpoints["qa"]
    repo = tmp_path / "hub" / "models--acme--tiny-squad"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for path in source.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "export", "acme/tiny-squad", str(tmp_path / "b"), "--variants", "fp32"]
    done = subprocess.run(
        [*command, "--max-seq-len", "48"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    manifest = load_bundle_manifest(tmp_path / "b")
    assert manifest.name == "tiny-squad" and manifest.task == "qa"
    assert (
        manifest.model["source_hub_id"] == "acme/tiny-squad" and commit in manifest.model["source_checkpoint"]
    )
    assert_matches_transformers(model, "qa", tmp_path / "b", variants=("fp32",))

    # An id the cache lacks, in-process (one interpreter start is enough): a clear one-line error.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", env["HF_HUB_CACHE"])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert main(["acme/not-cached", str(tmp_path / "c"), "--variants", "fp32"]) == 1
    assert "'acme/not-cached' is not a local directory" in capsys.readouterr().err
