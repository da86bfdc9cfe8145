"""The torch-free bundle reader: manifest contents, integrity checks, clear refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from export.bundle import (
    MANIFEST_NAME,
    BundleError,
    load_bundle_manifest,
    verify_bundle_files,
)

from .conftest import MAX_SEQ_LEN, TASKS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("task", TASKS)
def test_manifest_describes_the_task(bundles, task):
    manifest = load_bundle_manifest(bundles[task])
    assert manifest.task == task
    assert manifest.max_seq_len == MAX_SEQ_LEN
    assert manifest.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    expected_outputs = ["start_logits", "end_logits"] if task == "qa" else ["logits"]
    assert manifest.output_names == expected_outputs
    assert set(manifest.variants) == {"fp32", "fused", "int8", "int8-rowwise", "int8-rowwise-avx2", "fp16"}
    assert {v.intended_device for v in manifest.variants.values()} == {"any", "cpu", "cuda"}
    assert "vocab.txt" in manifest.tokenizer_files and "tokenizer_config.json" in manifest.tokenizer_files
    assert manifest.do_lower_case is True
    assert set(manifest.versions) >= {"torch", "onnx", "onnxruntime", "transformers"}
    if task == "classify":
        assert manifest.labels == ["negative", "positive"]
        assert manifest.problem_type == "single_label_classification"
    elif task == "ner":
        assert manifest.labels[:3] == ["O", "B-PER", "I-PER"] and len(manifest.labels) == 9
    else:
        assert manifest.labels is None
    if task == "qa":
        qa = manifest.qa_defaults
        assert set(qa) == {"doc_stride", "max_query_len", "max_answer_len"}
        # The question and one stride of context must fit the window.
        assert qa["doc_stride"] < MAX_SEQ_LEN - qa["max_query_len"] - 3
    else:
        assert manifest.qa_defaults is None


@pytest.mark.parametrize("variant", ["fp32", "fused", "int8", "int8-rowwise", "int8-rowwise-avx2", "fp16"])
def test_intact_bundle_verifies(bundles, variant):
    manifest = load_bundle_manifest(bundles["classify"])
    verify_bundle_files(bundles["classify"], manifest, variant)


def test_tampered_model_is_refused(bundle_copy):
    bundle = bundle_copy("ner")
    manifest = load_bundle_manifest(bundle)
    path = bundle / manifest.variants["fused"].file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"model_fused\.onnx.*sha256"):
        verify_bundle_files(bundle, manifest, "fused")
    verify_bundle_files(bundle, manifest, "fp32")  # the other variants are untouched


def test_truncated_model_is_refused(bundle_copy):
    bundle = bundle_copy("qa")
    manifest = load_bundle_manifest(bundle)
    path = bundle / manifest.variants["int8"].file
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(BundleError, match=r"model_int8\.onnx.*truncated"):
        verify_bundle_files(bundle, manifest, "int8")


def test_missing_model_is_refused(bundle_copy):
    bundle = bundle_copy("classify")
    manifest = load_bundle_manifest(bundle)
    (bundle / "model.onnx").unlink()
    with pytest.raises(BundleError, match=r"model\.onnx is missing"):
        verify_bundle_files(bundle, manifest, "fp32")


def test_changed_tokenizer_is_refused(bundle_copy):
    bundle = bundle_copy("classify")
    manifest = load_bundle_manifest(bundle)
    with open(bundle / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("extra\n")
    with pytest.raises(BundleError, match=r"vocab\.txt .*truncated or was replaced"):
        verify_bundle_files(bundle, manifest, "fp32")


def test_missing_tokenizer_file_is_refused(bundle_copy):
    bundle = bundle_copy("ner")
    manifest = load_bundle_manifest(bundle)
    (bundle / "tokenizer_config.json").unlink()
    with pytest.raises(BundleError, match=r"tokenizer_config\.json is missing"):
        verify_bundle_files(bundle, manifest, "fp32")


def test_unknown_variant_lists_the_available_ones(bundles):
    manifest = load_bundle_manifest(bundles["classify"])
    with pytest.raises(BundleError, match=r"no variant 'bf16'.*fp32"):
        verify_bundle_files(bundles["classify"], manifest, "bf16")


def _edit_manifest(bundle: Path, edit) -> None:
    data = json.loads((bundle / MANIFEST_NAME).read_text())
    edit(data)
    (bundle / MANIFEST_NAME).write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("task"), "missing key.*task"),
        (lambda d: d.update(format_version=99), "format_version 99 is not supported"),
        (lambda d: d.update(task="summarise"), "unknown task 'summarise'"),
        (lambda d: d.update(labels=None), "needs a non-empty labels list"),
        (lambda d: d["variants"]["fp32"].update(file="../model.onnx"), "plain file name"),
        (lambda d: d["variants"]["int8"].update(precision="int4"), "precision 'int4'"),
        (lambda d: d.update(variants={}), "no variants"),
        (
            lambda d: d["variants"]["int8"].update(disabled_optimizers="all"),
            "disabled_optimizers must be a list",
        ),
    ],
)
def test_malformed_manifest_is_refused(bundle_copy, edit, message):
    bundle = bundle_copy("classify")
    _edit_manifest(bundle, edit)
    with pytest.raises(BundleError, match=message):
        load_bundle_manifest(bundle)


def test_manifest_without_disabled_optimizers_still_loads(bundle_copy):
    """Bundles written before the key existed load with no optimizer disabled."""
    bundle = bundle_copy("classify")
    _edit_manifest(bundle, lambda d: [v.pop("disabled_optimizers", None) for v in d["variants"].values()])
    assert load_bundle_manifest(bundle).variants["int8"].disabled_optimizers == []


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="bundle.json is missing"):
        load_bundle_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle_manifest(tmp_path)
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle_manifest(tmp_path / "nope")


def test_reader_and_serving_path_never_import_torch(bundles):
    """Load, verify, tokenize and run a bundle the way the server does: no torch allowed."""
    code = f"""
import sys
import numpy as np
import onnxruntime as ort
import export
from export.bundle import load_bundle_manifest, verify_bundle_files
from processing.tokenizer import TextTokenizer
from processing.padding import pad_batch
bundle = {str(bundles["classify"])!r}
manifest = load_bundle_manifest(bundle)
verify_bundle_files(bundle, manifest, "int8")
tokenizer = TextTokenizer.from_dir(bundle)
feeds = pad_batch([tokenizer.encode("a good movie"), tokenizer.encode("boring", max_length=8)])
session = ort.InferenceSession(str(manifest.variant_path(bundle, "int8")), providers=["CPUExecutionProvider"])
(logits,) = session.run(manifest.output_names, {{n: feeds[n] for n in manifest.input_names}})
assert logits.shape == (2, len(manifest.labels)), logits.shape
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
