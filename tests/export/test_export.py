"""ONNX export of all four heads: dynamic shapes, parity, fused / int8 / fp16 tolerances.

Stated tolerances (tiny random models, logits of order 1-5):
- fp32 and fused vs PyTorch: max abs diff <= 1e-4 at real tokens.
- fp16 vs PyTorch: max abs diff <= 1e-2 x max(1, max |logit|).
- int8 vs PyTorch: max abs diff <= 0.25 x max(1, max |logit|), mean <= 0.05 x that scale,
  argmax agreement >= 80%. (Measured, per-channel int8: max 0.05-0.16, mean ~0.02, agreement 90-100%.)
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from export.bundle import load_bundle_manifest
from export.onnx_export import TRACE_BATCH, TRACE_CHOICES, TRACE_SEQ
from export.verify import make_session
from model.bert import TASK_HEADS

from .conftest import MAX_SEQ_LEN, TASKS

FP32_TOL = 1e-4
FP16_REL_TOL = 1e-2
INT8_MAX_REL, INT8_MEAN_REL, INT8_MIN_AGREEMENT = 0.25, 0.05, 0.8


def fresh_inputs(task: str, batch: int, seq: int, choices: int = 5, seed: int = 7) -> dict[str, np.ndarray]:
    """Right-padded random features at a shape no export step used; row 0 is full length."""
    rng = np.random.default_rng(seed)
    shape = (batch, choices, seq) if task == "multiple-choice" else (batch, seq)
    lengths = rng.integers(1, seq + 1, size=shape[:-1])
    lengths.flat[0] = seq
    mask = (np.arange(seq) < lengths[..., None]).astype(np.int64)
    ids = rng.integers(1, 100, size=shape).astype(np.int64) * mask
    types = ((np.arange(seq) >= lengths[..., None] // 2) & (mask == 1)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def torch_outputs(checkpoint, task: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    model = TASK_HEADS[task].from_pretrained(checkpoint).eval()
    with torch.no_grad():
        out = model(*(torch.from_numpy(feeds[n]) for n in ("input_ids", "attention_mask", "token_type_ids")))
    if task == "qa":
        return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}
    return {"logits": out.logits.numpy()}


def ort_outputs(bundle, variant: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    manifest = load_bundle_manifest(bundle)
    path = manifest.variant_path(bundle, variant)
    # As the service opens it: the variant's disabled optimizers, exact INT8 on every CPU.
    session = make_session(path, disabled_optimizers=manifest.variants[variant].disabled_optimizers)
    return dict(zip(manifest.output_names, session.run(manifest.output_names, feeds), strict=True))


def real(task: str, array: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Token-level outputs at real tokens only; padded positions carry no meaning."""
    return array[mask.astype(bool)] if task in ("ner", "qa") else array


def diffs(task, ref, got, mask) -> tuple[float, float, float]:
    delta = np.concatenate([np.abs(real(task, got[k], mask) - real(task, ref[k], mask)).ravel() for k in ref])
    scale = max(1.0, max(float(np.abs(v).max()) for v in ref.values()))
    return float(delta.max()), float(delta.mean()), scale


NEW_SHAPES = [(1, 1), (4, MAX_SEQ_LEN), (6, 13), (2, 31)]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize(("batch", "seq"), NEW_SHAPES)
@pytest.mark.parametrize("variant", ["fp32", "fused"])
def test_fp32_graphs_match_pytorch_at_untraced_shapes(checkpoints, bundles, task, batch, seq, variant):
    assert (batch, seq) != (TRACE_BATCH, TRACE_SEQ)
    feeds = fresh_inputs(task, batch, seq)
    ref = torch_outputs(checkpoints[task], task, feeds)
    got = ort_outputs(bundles[task], variant, feeds)
    for name in ref:
        assert got[name].shape == ref[name].shape, name
    worst, _, _ = diffs(task, ref, got, feeds["attention_mask"])
    assert worst <= FP32_TOL


@pytest.mark.parametrize("task", TASKS)
def test_fp16_graph_within_tolerance(checkpoints, bundles, task):
    feeds = fresh_inputs(task, 3, 19)
    ref = torch_outputs(checkpoints[task], task, feeds)
    got = ort_outputs(bundles[task], "fp16", feeds)
    for name in ref:
        assert got[name].dtype == np.float32, "keep_io_types must leave fp32 logits"
    worst, _, scale = diffs(task, ref, got, feeds["attention_mask"])
    assert worst <= FP16_REL_TOL * scale
    graph = onnx.load(str(bundles[task] / "model_fp16.onnx"))
    assert {i.type.tensor_type.elem_type for i in graph.graph.input} == {onnx.TensorProto.INT64}
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.graph.initializer)


def argmax_decisions(task, outputs, mask):
    if task == "qa":
        neg = np.where(mask.astype(bool), 0.0, -np.inf)
        return np.stack([(outputs[k] + neg).argmax(-1) for k in ("start_logits", "end_logits")], -1)
    return real(task, outputs["logits"].argmax(-1), mask)


@pytest.mark.parametrize("task", TASKS)
def test_int8_graph_within_tolerance(checkpoints, bundles, task):
    feeds = fresh_inputs(task, 16, 40, choices=3, seed=11)
    ref = torch_outputs(checkpoints[task], task, feeds)
    got = ort_outputs(bundles[task], "int8", feeds)
    worst, mean, scale = diffs(task, ref, got, feeds["attention_mask"])
    assert worst <= INT8_MAX_REL * scale and mean <= INT8_MEAN_REL * scale, (worst, mean, scale)
    mask = feeds["attention_mask"]
    agreement = np.mean(argmax_decisions(task, ref, mask) == argmax_decisions(task, got, mask))
    assert agreement >= INT8_MIN_AGREEMENT
    graph = onnx.load(str(bundles[task] / "model_int8.onnx"))
    ops = {n.op_type for n in graph.graph.node}
    assert ops & {"MatMulInteger", "QAttention", "DynamicQuantizeMatMul"}, ops


@pytest.mark.parametrize("task", TASKS)
def test_int8_graph_keeps_layer_norm_unfused_and_says_so(bundles, task, tmp_path):
    """CPU int8: residual Add + LayerNormalization, not the slow SkipLayerNormalization kernel; the
    manifest tells every loader to keep onnxruntime from fusing them back."""
    import onnxruntime as ort

    manifest = load_bundle_manifest(bundles[task])
    ops = Counter(n.op_type for n in onnx.load(str(bundles[task] / "model_int8.onnx")).graph.node)
    assert ops["SkipLayerNormalization"] == 0 and ops["LayerNormalization"] == 4  # 2 layers x 2
    assert ops["QAttention"] == 2 and ops["BiasGelu"] == 2  # the other fusions stay
    disabled = manifest.variants["int8"].disabled_optimizers
    assert disabled == ["SkipLayerNormFusion"] and manifest.variants["fused"].disabled_optimizers == []
    assert manifest.quantization["source_graph"]["disabled_optimizers"] == disabled
    for extra, refused in (({}, 4), ({"disabled_optimizers": disabled}, 0)):
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / "after.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(str(bundles[task] / "model_int8.onnx"), options, **extra)
        loaded = Counter(n.op_type for n in onnx.load(str(tmp_path / "after.onnx")).graph.node)
        assert loaded["SkipLayerNormalization"] == refused


@pytest.mark.parametrize("task", TASKS)
def test_graph_interface(bundles, task):
    graph = onnx.load(str(bundles[task] / "model.onnx"))
    assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) >= 17
    axes = ["batch", "choices", "sequence"] if task == "multiple-choice" else ["batch", "sequence"]
    for value in graph.graph.input:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == axes
    outputs = {
        o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.graph.output
    }
    expected = {
        "classify": {"logits": ["batch", 2]},
        "ner": {"logits": ["batch", "sequence", 9]},
        "multiple-choice": {"logits": ["batch", "choices"]},
        "qa": {"start_logits": ["batch", "sequence"], "end_logits": ["batch", "sequence"]},
    }[task]
    assert outputs == expected


def test_multiple_choice_choices_axis_is_dynamic(checkpoints, bundles):
    for choices in (1, 2, TRACE_CHOICES + 4):
        feeds = fresh_inputs("multiple-choice", 2, 9, choices=choices)
        got = ort_outputs(bundles["multiple-choice"], "fused", feeds)
        ref = torch_outputs(checkpoints["multiple-choice"], "multiple-choice", feeds)
        assert got["logits"].shape == (2, choices)
        assert np.abs(got["logits"] - ref["logits"]).max() <= FP32_TOL


def test_fused_graph_accepts_left_padding(checkpoints, bundles):
    """The fused Attention reads the raw mask, so padding side does not matter."""
    feeds = fresh_inputs("classify", 4, 20)
    feeds = {k: np.flip(v, axis=1).copy() for k, v in feeds.items()}  # padding now on the left
    ref = torch_outputs(checkpoints["classify"], "classify", feeds)
    got = ort_outputs(bundles["classify"], "fused", feeds)
    assert np.abs(got["logits"] - ref["logits"]).max() <= FP32_TOL


@pytest.mark.parametrize("task", TASKS)
def test_reports_in_manifest(bundles, task):
    manifest = load_bundle_manifest(bundles[task])
    report = manifest.verification
    for variant in ("fp32", "fused"):
        assert report[variant]["passed"] is True and report[variant]["max_abs_diff"] <= FP32_TOL
    shapes = [tuple(case["shape"]) for case in report["fp32"]["cases"]]
    seqs = {s[-1] for s in shapes}
    assert {1, MAX_SEQ_LEN} <= seqs and TRACE_SEQ not in seqs  # lengths the trace never saw
    assert report["fp16"]["passed"] is True or report["fp16"]["status"].startswith("not verified on CPU")
    fused = manifest.optimization["fused_operator_counts"]
    # Tiny model: 2 layers, gelu.
    assert fused == {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    assert manifest.optimization["all_expected_fused"] is True
    accuracy = manifest.quantization["accuracy_vs_fp32"]
    assert accuracy["eval_features"].startswith("random tokens")
    assert accuracy["argmax_agreement"] >= INT8_MIN_AGREEMENT
    assert manifest.quantization["source"] == "model_fused.onnx without SkipLayerNormalization"
