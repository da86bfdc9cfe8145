"""The invariant INT8 graph that benchmarks/cpu_int8.py times beside the served `int8-rowwise` and
ORT's dynamic INT8, rewritten from the graph the bundle's int8 variants start from:
`static per-tensor`, one fixed activation scale per quantized input (its largest |value| over
calibration sentences), so MatMulIntegerToFloat takes a scalar activation scale and the bias: no
row statistics, no rescale or bias pass; Q, K and V as one matmul. Retired candidates: docs/decisions.md.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np

from export import quantize_rowwise as qr
from export.verify import make_session


class Candidate:
    def __init__(self, name: str, path: Path, disabled: list[str] | None = None):
        self.name, self.path, self.disabled = name, path, list(disabled or [])

    def session(self, threads: int):
        return make_session(self.path, threads, self.disabled)


class StaticScales(qr._Rewriter):
    """One calibrated activation scale per quantized input (GELU's zero point as in int8-rowwise);
    Q, K and V as one matmul of the shared input (with its bias), split before MultiHeadAttention."""

    def __init__(self, graph, peaks: dict[str, float]):
        super().__init__(graph)
        self.peaks = peaks

    def quantize_rows_of(self, x: str, producer: str | None, width: int) -> tuple[str, str, int]:
        peak = max(self.peaks[x], qr.TINY)
        if producer in qr.GELU_OPS:
            zero_point = qr.GELU_ZERO_POINT
            step = max(peak / (255 - zero_point), -qr.GELU_MIN / zero_point)
        else:
            zero_point, step = qr.ZERO_POINT, peak / qr.QMAX
        scale = self.const("static_step", np.float32(step))
        zp = self.const(f"zp{zero_point}", np.uint8(zero_point), True)
        return self.node("QuantizeLinear", [x, scale, zp], "codes"), scale, zero_point

    def attention(self, node) -> bool:
        from onnx import helper

        x, weight_name, bias, mask = (list(node.input) + [""] * 4)[:4]
        weight = self.constant_matrix(weight_name)
        if weight is None or len(node.input) > 4 or not bias:
            return False
        qkv = [self.name(part) for part in "qkv"]
        sizes = self.const("qkv_sizes", np.array([weight.shape[1] // 3] * 3, np.int64), True)
        packed = self.node("Add", [self.matmul(x, weight), bias], "qkv_bias")  # into the matmul: fold_bias
        self.nodes.append(helper.make_node("Split", [packed, sizes], qkv, name=self.name("split"), axis=-1))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute} | {"domain": qr.MS_DOMAIN}
        inputs, attrs["name"] = [*qkv, ""] + ([mask] if mask else []), self.name("mha")
        self.nodes.append(helper.make_node("MultiHeadAttention", inputs, node.output, **attrs))
        return True


def fold_bias(graph) -> int:
    """MatMulIntegerToFloat with a scalar activation scale, then Add(constant [N]): the bias moves into
    the matmul's output pass. (Per-row scales cannot take it: the kernel would scale the bias too.)"""
    from onnx import numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    drop = []
    for node in graph.node:
        users = consumers[node.output[0]]
        scalar = node.op_type == "MatMulIntegerToFloat" and consts.get(node.input[2], np.ones(2)).size == 1
        if not (scalar and len(users) == 1 and users[0].op_type == "Add"):
            continue
        bias = [name for name in users[0].input if name != node.output[0]]
        if len(bias) == 1 and bias[0] in consts and consts[bias[0]].ndim == 1:
            del node.input[5:]
            node.input.extend(["", bias[0]])
            node.output[0] = users[0].output[0]
            drop.append(users[0])
    for node in drop:
        graph.node.remove(node)
    return len(drop)


def rewrite(source: Path, out: Path, peaks: dict[str, float]) -> Path:
    import onnx

    model = onnx.load(str(source))
    qr.upgrade_opset(model)
    StaticScales(model.graph, peaks).rewrite()
    fold_bias(model.graph)
    if not any(op.domain == qr.MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(qr.MS_DOMAIN, 1))
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out


def calibration_batches(bundle: Path, data: Path, count: int) -> list[dict[str, np.ndarray]]:
    """SST-2 training sentences (the recipe's training side, never its validation slice), one per batch."""
    from benchmarks.finetune import recipes
    from processing.padding import pad_batch
    from processing.tokenizer import TextTokenizer
    from train.splits import split_examples
    from train.train import run_options

    train, _ = split_examples(run_options(recipes(data)["sst2"]["data"]).data)
    tokenizer = TextTokenizer.from_dir(bundle)
    picked = np.random.default_rng(0).choice(len(train), size=min(count, len(train)), replace=False)
    return [pad_batch([tokenizer.encode(train[i].text, max_length=128)]) for i in picked]


def candidates(bundle: Path, work: Path, calibration: list[dict[str, np.ndarray]]) -> tuple[list, dict]:
    """The bundle's fused (accuracy reference), int8 and int8-rowwise, and `static per-tensor`."""
    from types import SimpleNamespace

    from export import optimize
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle)
    out = [
        Candidate(v, bundle / manifest.variants[v].file, manifest.variants[v].disabled_optimizers)
        for v in ("fused", "int8", "int8-rowwise")
    ]
    work.mkdir(parents=True, exist_ok=True)
    source = work / "int8_source.onnx"
    if not source.exists():
        fp32 = bundle / manifest.variants["fp32"].file
        optimize.fuse(fp32, source, SimpleNamespace(**manifest.model), skip_layer_norm=False)
    disabled = list(optimize.CPU_DISABLED_OPTIMIZERS)
    peaks = {k: float(v.max()) for k, v in qr.channel_peaks(source, calibration, disabled).items()}
    out.append(Candidate("static per-tensor", rewrite(source, work / "static.onnx", peaks), disabled))
    return out, {"static per-tensor": {"calibration_sentences": len(calibration)}}
