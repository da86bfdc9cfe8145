"""export_bundle options and refusals, the int8 metric hook, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import export.pipeline as pipeline
from export import ExportError, export_bundle
from export.__main__ import main
from export.bundle import load_bundle_manifest, verify_bundle_files
from export.verify import VerificationError, random_eval_batches
from model.bert import BertForSequenceClassification
from tests.helpers.tiny import make_tiny_checkpoint, tiny_config, write_tokenizer_files


def test_parity_failure_fails_the_export_and_writes_nothing(checkpoints, tmp_path, monkeypatch):
    real_run_torch = pipeline.run_torch

    def drifted(wrapper, names, feeds):  # as if the graph computed something else than the model
        return {k: v + 1e-3 for k, v in real_run_torch(wrapper, names, feeds).items()}

    monkeypatch.setattr(pipeline, "run_torch", drifted)
    out = tmp_path / "bundle"
    message = r"fp32 ONNX graph disagrees with PyTorch beyond 0.0001.*batch1_seq1"
    with pytest.raises(VerificationError, match=message):
        export_bundle(checkpoints["classify"], out, variants=("fp32",))
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no staging directory left behind


def test_variant_subset(checkpoints, tmp_path):
    out = export_bundle(checkpoints["ner"], tmp_path / "b", variants=("int8",), max_seq_len=32)
    manifest = load_bundle_manifest(out)
    assert list(manifest.variants) == ["int8"]
    assert sorted(p.name for p in out.glob("*.onnx")) == ["model_int8.onnx"]
    assert manifest.quantization["source"].startswith("model_fused.onnx")  # built from the fused graph
    verify_bundle_files(out, manifest, "int8")


def test_refuses_to_overwrite_without_flag(checkpoints, tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="exists and is not empty"):
        export_bundle(checkpoints["classify"], out, variants=("fp32",))
    assert (out / "keep.txt").read_text() == "mine"
    export_bundle(checkpoints["classify"], out, variants=("fp32",), overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "bundle.json").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variants": ("fp32", "bf16")}, r"unknown variant\(s\) \['bf16'\]"),
        ({"max_seq_len": 4096}, "max_seq_len 4096 must be in"),
        ({"eval_batches": [{"input_ids": np.zeros((2, 5), np.int64)}]}, "lacks attention_mask"),
        ({"opset": 13}, "opset 13 is too old"),
        ({"avx2_rounding": "stochastic"}, "avx2_rounding is 'feedback' or 'nearest', not 'stochastic'"),
    ],
)
def test_bad_arguments_are_named(checkpoints, tmp_path, kwargs, message):
    with pytest.raises((ExportError, ValueError), match=message):
        export_bundle(checkpoints["classify"], tmp_path / "b", **kwargs)


def test_the_avx2_variant_rounds_with_feedback_unless_told_nearest(checkpoints, tmp_path):
    """Feedback rounding changes the codes, never the pair budget or the 8-bit variant."""
    import onnx
    from onnx import numpy_helper

    def int8_weights(bundle, file):
        graph = onnx.load(str(bundle / file)).graph
        return [numpy_helper.to_array(i) for i in graph.initializer if i.data_type == onnx.TensorProto.INT8]

    variants = ("int8-rowwise", "int8-rowwise-avx2")
    fed = export_bundle(checkpoints["classify"], tmp_path / "fed", variants=variants)
    near = export_bundle(
        checkpoints["classify"], tmp_path / "near", variants=variants, avx2_rounding="nearest"
    )
    reports = [load_bundle_manifest(b).quantization for b in (fed, near)]
    assert [r["int8-rowwise-avx2"]["weight_rounding"][:14] for r in reports] == ["error feedback", "nearest"]
    assert all(r["int8-rowwise"]["weight_rounding"] == "nearest" for r in reports)
    assert all(r["int8-rowwise-avx2"]["int8_pair_peak"] <= 128 for r in reports)
    pairs = zip(*(int8_weights(b, "model_int8_rowwise_avx2.onnx") for b in (fed, near)), strict=True)
    same = [np.array_equal(a, b) for a, b in pairs]
    assert same and not all(same)
    eight_bit = [int8_weights(b, "model_int8_rowwise.onnx") for b in (fed, near)]
    assert all(np.array_equal(a, b) for a, b in zip(*eight_bit, strict=True))


def test_bad_qa_defaults_are_named(checkpoints, tmp_path):
    with pytest.raises(ExportError, match="doc_stride 40 must be smaller than the context window"):
        export_bundle(checkpoints["qa"], tmp_path / "b", max_seq_len=48, qa_defaults={"doc_stride": 40})
    out = export_bundle(
        checkpoints["qa"],
        tmp_path / "ok",
        variants=("fp32",),
        max_seq_len=48,
        qa_defaults={"doc_stride": 16, "max_answer_len": 12},
    )
    expected = {"doc_stride": 16, "max_query_len": 12, "max_answer_len": 12}
    assert load_bundle_manifest(out).qa_defaults == expected


def test_checkpoint_without_a_task_head_is_refused(tmp_path):
    ckpt = make_tiny_checkpoint("pretrain", tmp_path / "pretrain")
    with pytest.raises(ExportError, match="task 'pretrain'; export supports classify"):
        export_bundle(ckpt, tmp_path / "b")
    with pytest.raises(ExportError, match="no config.json"):
        export_bundle(tmp_path, tmp_path / "b")


def test_eval_batches_and_metric_hook(checkpoints, tmp_path):
    batches = random_eval_batches("classify", 100, max_seq_len=32, n_batches=3, batch_size=6, seed=5)
    rng = np.random.default_rng(0)
    gold = [rng.integers(0, 2, size=len(b["input_ids"])) for b in batches]
    calls = []

    def accuracy(outputs):
        calls.append(len(outputs))
        hits = sum(int((o["logits"].argmax(-1) == g).sum()) for o, g in zip(outputs, gold, strict=True))
        return {"accuracy": hits / sum(len(g) for g in gold), "label": "not a number"}

    out = export_bundle(
        checkpoints["classify"],
        tmp_path / "b",
        variants=("fp32", "int8"),
        max_seq_len=32,
        eval_batches=batches,
        metric_fn=accuracy,
    )
    report = load_bundle_manifest(out).quantization["accuracy_vs_fp32"]
    assert report["eval_features"] == "caller eval_batches" and report["examples"] == 18
    assert calls == [3, 3]  # once on fp32 outputs, once on int8 outputs
    # fp32 metric computed independently with the PyTorch model.
    model = BertForSequenceClassification.from_pretrained(checkpoints["classify"]).eval()
    with torch.no_grad():
        preds = [
            model(*(torch.from_numpy(b[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))
            .logits.argmax(-1)
            .numpy()
            for b in batches
        ]
    expected = sum(int((p == g).sum()) for p, g in zip(preds, gold, strict=True)) / 18
    metric = report["task_metric"]
    assert metric["fp32"]["accuracy"] == pytest.approx(expected)
    assert metric["int8_minus_fp32"] == {"accuracy": pytest.approx(metric["int8"]["accuracy"] - expected)}


def test_failing_metric_hook_is_reported(checkpoints, tmp_path):
    def broken(outputs):
        raise KeyError("labels")

    with pytest.raises(ValueError, match="metric_fn failed.*KeyError"):
        export_bundle(checkpoints["classify"], tmp_path / "b", variants=("int8",), metric_fn=broken)


def test_regression_head(tmp_path):
    config = tiny_config("classify")
    config.num_labels = 1
    torch.manual_seed(0)
    ckpt = tmp_path / "regression"
    BertForSequenceClassification(config).save_pretrained(ckpt)
    write_tokenizer_files(ckpt)
    manifest = load_bundle_manifest(export_bundle(ckpt, tmp_path / "b", variants=("fp32", "int8")))
    assert manifest.problem_type == "regression" and manifest.labels == ["LABEL_0"]
    assert manifest.outputs[0]["shape"] == ["batch", 1]
    assert manifest.quantization["accuracy_vs_fp32"]["argmax_agreement"] is None  # no argmax for a score


def test_a_mean_pooled_classifier_exports_its_pooling_and_stays_batch_invariant(tmp_path):
    import onnxruntime as ort

    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config("classify", classifier_pooling="mean")).eval()
    ckpt = tmp_path / "mean"
    model.save_pretrained(ckpt)
    write_tokenizer_files(ckpt)
    bundle = export_bundle(ckpt, tmp_path / "b", variants=("fp32", "int8-rowwise"))
    manifest = load_bundle_manifest(bundle)
    assert manifest.verification["int8-rowwise"]["batch_invariance"]["invariant"]
    session = ort.InferenceSession(str(bundle / "model.onnx"))
    ids = np.array([[2, 7, 8, 9, 3, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 1, 0, 0]])
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    names = {i.name for i in session.get_inputs()}
    served = session.run(None, {k: v for k, v in feeds.items() if k in names})[0]
    with torch.no_grad():  # the graph averages the real tokens, as training did
        expected = model(torch.tensor(ids[:, :5])).logits.numpy()
    np.testing.assert_allclose(served, expected, atol=1e-5)


def test_cli_exports_and_reports_errors(checkpoints, tmp_path, capsys):
    out = tmp_path / "cli"
    assert (
        main(
            [
                str(checkpoints["qa"]),
                str(out),
                "--variants",
                "fp32,fused",
                "--max-seq-len",
                "40",
                "--doc-stride",
                "8",
                "--quiet",
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    assert "task=qa" in printed.out and "model_fused.onnx" in printed.out and printed.err == ""
    manifest = json.loads((out / "bundle.json").read_text())
    assert manifest["qa_defaults"]["doc_stride"] == 8 and manifest["max_seq_len"] == 40
    assert main([str(checkpoints["qa"]), str(out), "--variants", "fp32"]) == 1
    assert "error: " in capsys.readouterr().err and (out / "model_fused.onnx").exists()


def test_cli_eval_features_file(checkpoints, tmp_path, capsys):
    features = random_eval_batches("ner", vocab_size=100, max_seq_len=24, n_batches=1, batch_size=10)[0]
    np.savez(tmp_path / "features.npz", **features)
    out = tmp_path / "cli"
    code = main(
        [
            str(checkpoints["ner"]),
            str(out),
            "--variants",
            "int8",
            "--eval-features",
            str(tmp_path / "features.npz"),
            "--eval-batch-size",
            "4",
        ]
    )
    assert code == 0
    assert "[export] int8 vs fp32 on caller eval_batches" in capsys.readouterr().err
    assert load_bundle_manifest(out).quantization["accuracy_vs_fp32"]["batches"] == 3


def test_cli_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--variants",
        "--max-seq-len",
        "--name",
        "--opset",
        "--doc-stride",
        "--max-query-len",
        "--max-answer-len",
        "--eval-features",
        "--eval-batch-size",
        "--overwrite",
        "--quiet",
    ):
        assert option in text


@pytest.mark.slow
def test_real_minilm_fuses_completely(tmp_path):
    """The real 6-layer MiniLM graph: every expected fusion fires."""
    from model.checkpoint import minilm_package_dir

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_package_dir(), task="classify")
    model.save_pretrained(tmp_path / "minilm")
    manifest = load_bundle_manifest(
        export_bundle(tmp_path / "minilm", tmp_path / "b", variants=("fused",), max_seq_len=128)
    )
    assert manifest.optimization["fused_operator_counts"] == {
        "EmbedLayerNormalization": 1,
        "Attention": 6,
        "SkipLayerNormalization": 12,
        "BiasGelu": 6,
    }
    assert manifest.verification["fused"]["max_abs_diff"] <= 1e-4
