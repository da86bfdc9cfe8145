"""The default CPU variant gives a row the same outputs alone and inside any batch, for every task;
ORT's dynamic INT8 does not; the per-token quantizer computes what its formula says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import export.pipeline as pipeline
from app.engine.runtime import choose_variant
from export import export_bundle
from export.bundle import load_bundle_manifest
from export.invariance import INVARIANCE_TOLERANCE, batch_invariance, row_alone
from export.verify import VerificationError, make_session, run_session

from .conftest import MAX_SEQ_LEN, TASKS


def mixed_batches(task: str, vocab_size: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Right-padded batches of rows of different lengths (choices of different lengths, too)."""
    rng = np.random.default_rng(seed)
    batches = []
    for lengths in ([MAX_SEQ_LEN, 1, 17, 30, 5, 2], [9, 3], [MAX_SEQ_LEN - 1, MAX_SEQ_LEN]):
        shape = (len(lengths), 3) if task == "multiple-choice" else (len(lengths),)
        real = np.minimum(np.asarray(lengths).reshape(len(lengths), *[1] * (len(shape) - 1)), MAX_SEQ_LEN)
        real = real - (np.arange(shape[-1]) if task == "multiple-choice" else 0)  # choices differ too
        real = np.maximum(real, 1)
        seq = int(real.max())
        mask = (np.arange(seq) < real[..., None]).astype(np.int64)
        ids = rng.integers(5, vocab_size, size=mask.shape) * mask
        types = ((np.arange(seq) >= real[..., None] // 2) & (mask == 1)).astype(np.int64)
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    return batches


def invariance(bundle, variant: str) -> dict:
    manifest = load_bundle_manifest(bundle)
    info = manifest.variants[variant]
    session = make_session(bundle / info.file, disabled_optimizers=info.disabled_optimizers, variant=variant)
    vocab = len((bundle / "vocab.txt").read_text().splitlines())
    batches = mixed_batches(manifest.task, vocab)
    return batch_invariance(manifest.task, lambda feeds: run_session(session, feeds), batches)


ROWWISE = ("int8-rowwise", "int8-rowwise-avx2")  # the defaults on CPUs with and without VNNI


@pytest.mark.parametrize("variant", ROWWISE)
@pytest.mark.parametrize("task", TASKS)
def test_default_cpu_variants_are_batch_invariant_for_every_task(bundles, task, variant):
    manifest = load_bundle_manifest(bundles[task])
    assert choose_variant("cpu", manifest.variants) in ROWWISE
    report = invariance(bundles[task], variant)
    assert report["rows"] == 10
    assert report["max_abs_diff"] <= INVARIANCE_TOLERANCE, report
    # Export checked it too, and recorded what each variant does.
    assert manifest.verification[variant]["batch_invariance"]["invariant"] is True
    assert manifest.verification["fused"]["batch_invariance"]["max_abs_diff"] <= INVARIANCE_TOLERANCE
    # The weight range the variant promises, checked by export and here.
    peak = manifest.quantization[variant]["int8_pair_peak"]
    assert peak > 128 if variant == "int8-rowwise" else peak <= 128


@pytest.mark.parametrize("task", TASKS)
def test_rows_alone_on_every_core_equal_rows_batched_on_one(bundles, task):
    """The service runs a lone request on a session with all the model's cores (the solo session)
    and batches on single-threaded ones: a row must come out the same either way."""
    from app.engine.runtime import SessionTuning, create_runtime

    manifest = load_bundle_manifest(bundles[task])
    default = choose_variant("cpu", manifest.variants)
    path = manifest.variant_path(bundles[task], default)
    disabled = manifest.variants[default].disabled_optimizers
    one = create_runtime(
        path, "cpu", 1, SessionTuning(spinning=False), disabled_optimizers=disabled, variant=default
    )
    solo = SessionTuning(spinning=True, stop_spinning_after_run=True)
    every = create_runtime(path, "cpu", 4, solo, disabled_optimizers=disabled, variant=default)
    vocab = len((bundles[task] / "vocab.txt").read_text().splitlines())
    report = batch_invariance(task, one.run, mixed_batches(task, vocab), every.run)
    assert report["rows"] == 10 and report["max_abs_diff"] <= INVARIANCE_TOLERANCE, report


@pytest.mark.parametrize("task", ["classify", "qa"])
def test_dynamic_int8_moves_with_its_batch(bundles, task):
    # The check can fail: ORT's per-tensor activation scale depends on the whole batch.
    assert invariance(bundles[task], "int8")["max_abs_diff"] > 1e-4


def test_row_alone_cuts_the_row_to_its_own_length():
    feeds = {
        "input_ids": np.array([[5, 6, 7], [8, 0, 0]]),
        "attention_mask": np.array([[1, 1, 1], [1, 0, 0]]),
    }
    assert row_alone(feeds, 1)["input_ids"].tolist() == [[8]]
    choices = {"attention_mask": np.array([[[1, 1, 0, 0], [1, 1, 1, 0]]])}  # longest choice: 3 tokens
    assert row_alone(choices, 0)["attention_mask"].shape == (1, 2, 3)


@pytest.mark.parametrize("after_gelu", [False, True])
def test_rowwise_matmul_matches_its_formula(tmp_path, after_gelu):
    """One MatMul rewritten: per-row uint8 codes around a constant zero point (128, or 32 after GELU,
    whose outputs are mostly positive), per-column symmetric int8 weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from export.quantize_rowwise import (
        GELU_MIN,
        GELU_ZERO_POINT,
        MS_DOMAIN,
        quantize_rowwise,
        quantize_weight,
    )

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["h" if after_gelu else "x", "w"], ["y"])]
    if after_gelu:
        nodes.insert(0, helper.make_node("Gelu", ["x"], ["h"], domain=MS_DOMAIN))
    graph = helper.make_graph(
        nodes,
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)]
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), src)
    report = quantize_rowwise(src, dst)
    assert report["rewritten"] == {"MatMul": 1} and report["remaining_float_matmul"] == 0
    x = rng.standard_normal((2, 3, 16)).astype(np.float32) * np.array([1, 10, 0.01], np.float32)[:, None]
    x[1, 2] = 0  # an all-zero row quantizes to zeros
    got = make_session(dst).run(None, {"x": x})[0]
    if after_gelu:
        from scipy.special import erf

        x = (0.5 * x * (1 + erf(x / np.sqrt(2)))).astype(np.float32)
        z = GELU_ZERO_POINT
        assert x.min() >= GELU_MIN  # the floor the negative side's step rests on
        step = np.maximum(x.max(-1, keepdims=True) / (255 - z), np.float32(-GELU_MIN / z))
        unclipped = np.rint(x / step)
        assert (unclipped >= -z).all() and (unclipped <= 255 - z).all()  # nothing clips
        # Rows whose maximum sets the step reach the top code; the all-zero row is among the others.
        top = x.max(-1) / (255 - z) >= -GELU_MIN / z
        assert top.sum() >= 3 and (unclipped.max(-1)[top] == 255 - z).all()
        codes = unclipped
    else:
        step = np.abs(x).max(-1, keepdims=True) / np.float32(127) + np.float32(1e-30)
        codes = np.clip(np.rint(x / step), -127, 127)
    w_codes, w_scales = quantize_weight(weight)
    expected = (codes @ w_codes.astype(np.float32)) * w_scales * step
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert np.abs(got[1, 2]).max() == 0
    np.testing.assert_allclose(got, x @ weight, atol=0.05 * np.abs(x @ weight).max())


def test_outlier_channels_go_through_fp32_beside_the_int8_matmul(tmp_path):
    """The embed recipe: the channels largest over calibration rows are taken out of the INT8
    matmul and multiplied in fp32 (chosen once, so rows stay independent); after GELU, fp32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from export.calibration import outlier_channels
    from export.quantize_rowwise import MS_DOMAIN, quantize_rowwise

    rng = np.random.default_rng(1)
    weight = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)]
    src, plain, mixed = tmp_path / "f.onnx", tmp_path / "q.onnx", tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), src)
    # Channels 3 and 11 are huge, as a few of BERT's are; padding (mask 0) must not count.
    x = rng.standard_normal((4, 5, 16)).astype(np.float32)
    x[..., 3] *= 80
    x[..., 11] *= 40
    mask = np.ones((4, 5), np.int64)
    padded = x.copy()
    padded[0, 4, 7] = 1e6
    mask[0, 4] = 0
    calibration = [{"x": padded, "attention_mask": mask}]
    picked = outlier_channels(src, calibration, 2)
    assert {k: v.tolist() for k, v in picked.items()} == {"x": [3, 11]}
    quantize_rowwise(src, plain)
    report = quantize_rowwise(src, mixed, picked)
    assert report["outlier_channels"] == {"per_input": 2, "inputs": 1}
    exact = x @ weight
    errors = {
        path.name: np.abs(make_session(path).run(None, {"x": x})[0] - exact).max() for path in (plain, mixed)
    }
    assert errors["m.onnx"] < errors["q.onnx"] / 5, errors
    assert make_session(mixed).run(None, {"x": x[:1, :2]})[0].tolist() == (
        make_session(mixed).run(None, {"x": x[:1]})[0][:, :2].tolist()
    )


def test_embed_bundles_use_the_outlier_recipe_and_the_others_do_not(app_bundles):
    from export.bundle import load_bundle_manifest

    recipes = {
        task: load_bundle_manifest(path).quantization["int8-rowwise"] for task, path in app_bundles.items()
    }
    assert recipes["embed"]["outlier_channels"]["per_input"] == 16 and recipes["embed"]["float_after_gelu"]
    assert recipes["embed"]["outlier_channels"]["chosen_on"] == "random tokens (no eval_batches given)"
    for task in ("classify", "ner", "multiple-choice", "qa"):
        assert recipes[task]["outlier_channels"]["per_input"] == 0 and not recipes[task]["float_after_gelu"]
    avx2 = {
        task: load_bundle_manifest(path).quantization["int8-rowwise-avx2"]
        for task, path in app_bundles.items()
    }
    assert all(r["weight_rounding"].startswith("error feedback") for r in avx2.values())
    assert avx2["embed"]["outlier_channels"]["per_input"] == 16


def test_the_outlier_channels_are_found_once_for_both_rowwise_variants(tiny_models, tmp_path, monkeypatch):
    from export import pipeline

    found = []
    real = pipeline.calibration.outlier_channels
    monkeypatch.setattr(
        pipeline.calibration, "outlier_channels", lambda *a, **k: found.append(1) or real(*a, **k)
    )
    variants = ("int8-rowwise", "int8-rowwise-avx2")
    export_bundle(tiny_models.checkpoint("embed"), tmp_path / "b", variants=variants, max_seq_len=32)
    quantization = load_bundle_manifest(tmp_path / "b").quantization
    assert len(found) == 1 and all(quantization[v]["outlier_channels"]["per_input"] for v in variants)


def test_export_fails_when_the_invariant_variant_is_not(checkpoints, tmp_path, monkeypatch):
    # As if the rewrite had produced ORT's batch-dependent graph: the export must refuse it.
    monkeypatch.setattr(
        pipeline.quantize_rowwise,
        "quantize_rowwise",
        lambda src, dst, **recipe: pipeline.quantize.quantize_int8(src, dst),
    )
    with pytest.raises(VerificationError, match="int8-rowwise is meant to be batch-invariant"):
        export_bundle(checkpoints["classify"], tmp_path / "b", variants=("int8-rowwise",), max_seq_len=32)
    assert not (tmp_path / "b").exists()


DEFAULT_BUNDLES = Path(__file__).resolve().parents[2] / ".cache" / "bundles"
# The six bundles `make serve` builds there.
DEFAULT_NAMES = (
    "sst2-minilm",
    "conll03-minilm",
    "codah-minilm",
    "squad-minilm",
    "all-minilm-l6-v2",
    "rerank-minilm",
)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ROWWISE)
@pytest.mark.parametrize("name", DEFAULT_NAMES)
def test_the_real_default_bundles_are_batch_invariant(name, variant):
    """The six defaults as `make serve` builds them (skipped before they are built)."""
    bundle = DEFAULT_BUNDLES / name
    if not (bundle / "bundle.json").exists():
        pytest.skip(f"{bundle} is not built (python -m export.defaults --out .cache/bundles)")
    if variant not in load_bundle_manifest(bundle).variants:
        pytest.skip(f"{bundle} predates {variant}: rebuild it with python -m export.defaults")
    report = invariance(bundle, variant)
    assert report["rows"] == 10 and report["max_abs_diff"] <= INVARIANCE_TOLERANCE, report


@pytest.mark.parametrize("stages", [frozenset(), frozenset({"blocked"}), frozenset({"gelu_floor"})])
def test_every_stage_of_the_rewrite_keeps_rows_independent(tmp_path, stages):
    """The blocked QuantizeLinear needs opset 21: the rewrite raises the graph's opset, moving the
    `axes` attributes that became inputs (a ReduceMean here) and keeping what the graph computes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from export.quantize_rowwise import MS_DOMAIN, quantize_rowwise

    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("Gelu", ["a"], ["h"], domain=MS_DOMAIN),
        helper.make_node("MatMul", ["h", "w2"], ["b"]),
        helper.make_node("ReduceMean", ["b"], ["y"], axes=[1], keepdims=0),
    ]
    weights = [rng.standard_normal(shape).astype(np.float32) for shape in ((16, 32), (32, 8))]
    graph = helper.make_graph(
        nodes,
        "two_matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(w, f"w{i + 1}") for i, w in enumerate(weights)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)]
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), src)
    report = quantize_rowwise(src, dst, stages=stages)
    assert report["stages"] == sorted(stages) and report["rewritten"] == {"MatMul": 2}
    model = onnx.load(dst)
    assert {o.domain: o.version for o in model.opset_import}[""] == 21
    mean = next(n for n in model.graph.node if n.op_type == "ReduceMean")
    assert not mean.attribute or all(a.name != "axes" for a in mean.attribute)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    session = make_session(dst)
    batched = session.run(None, {"x": x})[0]
    exact = make_session(src).run(None, {"x": x})[0]
    assert np.abs(batched - exact).max() < 0.05 * np.abs(exact).max()
    for i in range(3):  # each sequence alone: its mean over the same rows, bit for bit
        assert session.run(None, {"x": x[i : i + 1]})[0].tolist() == batched[i : i + 1].tolist()
