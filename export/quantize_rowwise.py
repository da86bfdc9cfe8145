"""Batch-invariant INT8: every token's activations get their own quantization scale.

ONNX Runtime's dynamic quantization takes one activation scale per tensor, over the whole
batch (padding included), so a request's logits move with whatever shares its batch. This
rewrite of the fused fp32 graph quantizes each token row on its own instead, with plain ONNX
ops, so a row's outputs depend on that row alone:

    step_r = max|x_r| / 127                        (Abs, ReduceMax over the hidden axis, Mul, Add)
    q_r    = round(x_r / step_r) + Z               (one blocked QuantizeLinear, a block per row: uint8)
    y_r    = ((q_r - Z) . W_q) * scale_w * step_r
             MatMulIntegerToFloat: exact int32 accumulation, per-column weight scales, and its
             activation scale given per row ([..., 1]), which it applies to its output

The zero point Z is a constant, because ONNX Runtime's integer matmuls take only one activation
zero point per tensor; the per-row part lives in the step, which multiplies the float result.
Z is 128 (symmetric) except after GELU, whose outputs lie in [GELU_MIN, max]: there Z = 32 and
step_r = max(max_r / 223, -GELU_MIN / 32), which gives the positive side 1.75x the codes and
needs no ReduceMin (nothing clips: GELU is never below GELU_MIN).
Weights are int8, symmetric, one scale per output column, codes in [-127, 127]; with `pair_budget`
(`int8-rowwise-avx2`) also |w[2j]| + |w[2j+1]| <= pair_budget for every same-signed pair of adjacent
K rows (int8_precision.pair_load), so the 16-bit pair sums of the non-VNNI x86 kernels cannot
saturate (export/int8_precision.py) and those run it exactly at full speed; its codes are rounded
with error feedback against calibration statistics (`products`: export/calibration.py), which wins
back most of the precision the budget costs.
The per-row division lives in QuantizeLinear's blocked form (opset 21), so the graph's default
opset is raised to 21 (`upgrade_opset`). Every op here is one pass over the activation or a
[..., 1] one: the cost beside dynamic INT8 is benchmarks/cpu_int8.py's `profile`.
Each attention block's Q, K and V projections become three such matmuls on one quantized input,
feeding MultiHeadAttention (scores, softmax and context stay fp32, as in QAttention). Embeddings,
LayerNorm, GELU, the pooler and the classifier stay fp32. Bias adds stay outside the matmul:
inside it they would be multiplied by the row scale.

Outputs read as they are (sentence embeddings, compared by cosine) need more: a few hidden
channels carry values far beyond the rest, so one scale per token leaves the others few codes.
`outliers` keeps, per quantized input, a fixed set of channels (the largest over calibration
features, found by calibration.outlier_channels) in an fp32 matmul beside the INT8 one (LLM.int8()'s
decomposition, with the set fixed at export so a row still depends on itself alone), and
`float_after_gelu` keeps the FFN output projections fp32.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from .calibration import MS_DOMAIN, round_with_feedback
from .int8_precision import pair_load

ZERO_POINT = 128  # uint8 code of 0.0: symmetric activations on the u8 x s8 kernels
QMAX = 127.0  # activation codes each side of the zero point, and the int8 weights' range
GELU_OPS = ("Gelu", "BiasGelu", "FastGelu")
# Chosen on the defaults' validation data among 128 (symmetric), 16 and 32: benchmarks/cpu_int8.md.
GELU_ZERO_POINT = 32
# GELU's minimum is -0.16997 (erf form; the tanh form's -0.17004): a floor on the negative side.
GELU_MIN = -0.171
OPSET = 21  # QuantizeLinear's block_size
# Ops whose `axes` attribute became an input at opset 18 (ReduceSum's did at 13).
AXES_TO_INPUT = {
    f"Reduce{op}" for op in ("Max", "Min", "Mean", "Prod", "L1", "L2", "LogSum", "LogSumExp", "SumSquare")
}
# The changes benchmarks/cpu_int8.py timed one at a time against the first rewrite, which had none
# (its results at commit f999225; docs/decisions.md, int8_kernel):
# "blocked": the per-row division inside a blocked QuantizeLinear, not a Div before a per-tensor one;
# "gelu_floor": GELU_MIN bounds GELU's negative side instead of a ReduceMin.
STAGES = frozenset({"blocked", "gelu_floor"})
TINY = 1e-30  # added to every scale: an all-zero row quantizes to zeros instead of 0 / 0
TOOL = "export.quantize_rowwise: per-token symmetric uint8 activations, per-column symmetric int8 weights"
BEHAVIOUR = "per-token activation scales: a row's outputs do not depend on what shares its batch"


def quantize_weight(
    weight: np.ndarray, pair_budget: int | None = None, product: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes and fp32 scales, one per output column, symmetric: weight ~= codes * scales. With
    `pair_budget`, each column's scale also fits its largest pair_load into the budget. Codes are
    rounded with error feedback against `product` (its input's X^T X: calibration.round_with_feedback)
    where given, else to nearest, a same-signed pair that rounding pushed over the budget giving up
    one step on its larger code."""
    k, n = weight.shape
    scales = np.abs(weight).max(axis=0) / QMAX
    if pair_budget is not None:
        scales = np.maximum(scales, pair_load(weight).max(axis=0) / pair_budget)
    scales = np.maximum(scales, TINY / QMAX).astype(np.float32)
    if product is not None:
        return round_with_feedback(weight, scales, product, pair_budget), scales
    codes = np.clip(np.rint(weight / scales), -QMAX, QMAX).astype(np.int32)
    if pair_budget is not None:
        padded = np.concatenate([codes, np.zeros((k % 2, n), np.int32)])  # [K (even), N]
        even, odd = padded[0::2], padded[1::2]  # views: [K/2, N] each
        over = pair_load(padded) > pair_budget  # by one step at most (each code rounds by 1/2)
        odd_larger = np.abs(odd) > np.abs(even)
        even -= np.sign(even) * (over & ~odd_larger)
        odd -= np.sign(odd) * (over & odd_larger)
        codes = padded[:k]
    return codes.astype(np.int8), scales


class _Rewriter:
    def __init__(
        self,
        graph,
        outliers=None,
        float_after_gelu: bool = False,
        stages: frozenset = STAGES,
        pair_budget: int | None = None,
        products=None,
    ):
        from onnx import numpy_helper

        self.stages = stages
        self.pair_budget = pair_budget
        self.products = products or {}  # quantized input -> its X^T X, for error-feedback rounding
        self.outliers = outliers or {}  # quantized input -> channels kept fp32
        self.gathered: dict[str, str] = {}  # quantized input -> its outlier channels
        self.float_after_gelu = float_after_gelu

        self.graph = graph
        self.weights = {i.name: i for i in graph.initializer}
        self.to_array = numpy_helper.to_array
        self.new_initializers: list = []
        self.nodes: list = []
        self.quantized: dict[str, tuple[str, str, int]] = {}  # fp32 tensor -> (codes, row scales, zp)
        self.producers = {out: node.op_type for node in graph.node for out in node.output}
        self.constants: dict[str, str] = {}
        self.counter: Counter = Counter()

    def name(self, stem: str) -> str:
        self.counter[stem] += 1
        return f"rowwise/{stem}_{self.counter[stem]}"

    def const(self, stem: str, value: Any, shared: bool = False) -> str:
        from onnx import numpy_helper

        if shared and stem in self.constants:
            return self.constants[stem]
        name = self.name(stem)
        self.new_initializers.append(numpy_helper.from_array(np.asarray(value), name))
        if shared:
            self.constants[stem] = name
        return name

    def node(self, op: str, inputs: list[str], stem: str, domain: str = "", **attrs) -> str:
        from onnx import helper

        out = self.name(stem)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, domain=domain or None, **attrs))
        return out

    def constant_matrix(self, name: str) -> np.ndarray | None:
        value = self.to_array(self.weights[name]) if name in self.weights else None
        return value if value is not None and value.ndim == 2 and value.dtype == np.float32 else None

    def quantize_rows(self, x: str, width: int) -> tuple[str, str, int]:
        """uint8 codes of `x` [..., width], its scales [..., 1] (one per row) and its zero point;
        shared by every consumer of `x` (Q, K and V: one quantization).
        Outlier channels (self.outliers) are zeroed first: an fp32 matmul carries them."""
        if x not in self.quantized:
            source = x
            if x in self.outliers:
                keep = np.ones(width, np.float32)
                keep[self.outliers[x]] = 0.0
                source = self.node("Mul", [x, self.const("inliers", keep)], "inliers")
            self.quantized[x] = self.quantize_rows_of(source, self.producers.get(x), width)
        return self.quantized[x]

    def quantize_rows_of(self, x: str, producer: str | None, width: int) -> tuple[str, str, int]:
        axes = self.const("last_axis", np.array([-1], np.int64), True)
        tiny = self.const("tiny", np.float32(TINY), True)
        if producer in GELU_OPS:
            # A low zero point gives GELU's positive side more codes than a symmetric one; GELU_MIN
            # bounds the negative side: step = max(max / (255 - Z), -GELU_MIN / Z), nothing clips.
            zero_point = GELU_ZERO_POINT
            high = self.node("ReduceMax", [x, axes], "max", keepdims=1)
            up = self.node(
                "Mul", [high, self.const("inv_up", np.float32(1 / (255 - zero_point)), True)], "up"
            )
            if "gelu_floor" in self.stages:
                step = self.node(
                    "Max", [up, self.const("gelu_floor", np.float32(-GELU_MIN / zero_point), True)], "step"
                )
            else:
                low = self.node("ReduceMin", [x, axes], "min", keepdims=1)
                down = self.node(
                    "Mul", [low, self.const("inv_down", np.float32(-1 / zero_point), True)], "down"
                )
                step = self.node("Add", [self.node("Max", [up, down], "step0"), tiny], "step")
        else:
            zero_point = ZERO_POINT
            amax = self.node("ReduceMax", [self.node("Abs", [x], "abs"), axes], "amax", keepdims=1)
            scaled = self.node("Mul", [amax, self.const("inv_qmax", np.float32(1 / QMAX), True)], "step0")
            step = self.node("Add", [scaled, tiny], "step")
        if "blocked" in self.stages:
            zp = self.row_zero_point(step, zero_point)
            codes = self.node("QuantizeLinear", [x, step, zp], "codes", axis=-1, block_size=width)
        else:
            unit = self.node("Div", [x, step], "unit")
            zp = self.const(f"zp{zero_point}", np.uint8(zero_point), True)
            codes = self.node("QuantizeLinear", [unit, self.const("one", np.float32(1), True), zp], "codes")
        return codes, step, zero_point

    def row_zero_point(self, step: str, zero_point: int) -> str:
        """Blocked QuantizeLinear takes a zero point shaped like its steps ([..., 1]); every quantized
        input has the same token rows, so one per zero point serves the graph (a mismatch would
        fail loudly in ONNX Runtime's shape check, and export runs several shapes)."""
        key = f"zero_point_rows{zero_point}"
        if key not in self.constants:
            value = self.const(f"zp{zero_point}", np.uint8(zero_point), True)
            self.constants[key] = self.node("Expand", [value, self.node("Shape", [step], "rows")], key)
        return self.constants[key]

    def matmul(self, x: str, weight: np.ndarray, output: str | None = None) -> str:
        """x [..., K] . weight [K, N] -> [..., N] fp32 through int8, with per-row activation scales."""
        from onnx import helper

        if self.float_after_gelu and self.producers.get(x) in GELU_OPS:
            return self.float_matmul(x, weight, output)
        codes, scale, zero_point = self.quantize_rows(x, weight.shape[0])
        w_codes, w_scales = quantize_weight(weight, self.pair_budget, self.inlier_product(x))
        inputs = [
            codes,
            self.const("w", w_codes),
            scale,
            self.const("w_scale", w_scales),
            self.const(f"a_zero_point{zero_point}", np.array([zero_point], np.uint8), True),
        ]
        if x not in self.outliers:
            out = output or self.name("matmul")
            self.nodes.append(
                helper.make_node(
                    "MatMulIntegerToFloat", inputs, [out], name=self.name("int8"), domain=MS_DOMAIN
                )
            )
            return out
        # x . W = inliers . W (INT8) + x[outliers] . W[outliers] (fp32)
        main = self.name("matmul")
        self.nodes.append(
            helper.make_node("MatMulIntegerToFloat", inputs, [main], name=self.name("int8"), domain=MS_DOMAIN)
        )
        channels = self.outliers[x]
        if x not in self.gathered:  # shared by Q, K and V
            index = self.const("outlier_index", channels)
            self.gathered[x] = self.node("Gather", [x, index], "outliers", axis=-1)
        side = self.float_matmul(self.gathered[x], weight[channels])
        out = output or self.name("sum")
        self.nodes.append(helper.make_node("Add", [main, side], [out], name=self.name("add")))
        return out

    def inlier_product(self, x: str) -> np.ndarray | None:
        """X^T X of what the INT8 matmul of `x` sees: outlier channels are zeroed before it."""
        product = self.products.get(x)
        if product is not None and x in self.outliers:
            product = product.copy()
            product[self.outliers[x]] = 0.0
            product[:, self.outliers[x]] = 0.0
        return product

    def float_matmul(self, x: str, weight: np.ndarray, output: str | None = None) -> str:
        from onnx import helper

        out = output or self.name("fp32_matmul")
        self.nodes.append(
            helper.make_node(
                "MatMul", [x, self.const("w_fp32", weight.astype(np.float32))], [out], name=self.name("fp32")
            )
        )
        return out

    def attention(self, node) -> bool:
        """Attention(x, W_qkv, b_qkv, mask) -> three int8 projections + MultiHeadAttention."""
        from onnx import helper

        x, weight_name, bias, mask = (list(node.input) + [""] * 4)[:4]
        weight = self.constant_matrix(weight_name)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = set(attrs) <= {"num_heads", "mask_filter_value", "scale"}
        if weight is None or len(node.input) > 4 or not bias or not plain:
            return False  # past state, attention bias, unusual options: keep the fp32 node
        hidden = weight.shape[1] // 3
        qkv = [self.matmul(x, weight[:, i * hidden : (i + 1) * hidden]) for i in range(3)]
        inputs = [*qkv, bias] + ([mask] if mask else [])
        self.nodes.append(
            helper.make_node(
                "MultiHeadAttention",
                inputs,
                list(node.output),
                name=self.name("mha"),
                domain=MS_DOMAIN,
                **attrs,
            )
        )
        return True

    def rewrite(self) -> dict[str, int]:
        done: Counter = Counter()
        for node in list(self.graph.node):
            if node.op_type == "MatMul" and (weight := self.constant_matrix(node.input[1])) is not None:
                self.matmul(node.input[0], weight, output=node.output[0])
                done["MatMul"] += 1
            elif node.op_type == "Attention" and node.domain == MS_DOMAIN and self.attention(node):
                done["Attention"] += 1
            else:
                self.nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        used = {name for n in self.graph.node for name in n.input}
        keep = [i for i in [*self.graph.initializer, *self.new_initializers] if i.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep)
        return dict(done)


def upgrade_opset(model, version: int = OPSET) -> None:
    """Raise the default-domain opset to `version`, moving the `axes` attributes that became inputs
    at opset 18; the other changes between 14 and 21 add types or optional inputs only."""
    from onnx import helper, numpy_helper

    default = [op for op in model.opset_import if op.domain in ("", "ai.onnx")]
    if not default or default[0].version >= version:
        return
    if default[0].version < 13:
        raise ValueError(f"opset {default[0].version} is too old to raise to {version}")
    default[0].version = version
    model.ir_version = max(model.ir_version, 10)  # IR 10 came with opset 21
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.domain in ("", "ai.onnx") and node.op_type in AXES_TO_INPUT and "axes" in attrs:
            name = f"{node.name or node.output[0]}/axes"
            axes = np.array(helper.get_attribute_value(attrs["axes"]), np.int64)
            model.graph.initializer.append(numpy_helper.from_array(axes, name))
            node.attribute.remove(attrs["axes"])
            node.input.append(name)


def quantize_rowwise(
    src: Path,
    dst: Path,
    outliers: dict[str, np.ndarray] | None = None,
    float_after_gelu: bool = False,
    stages: frozenset = STAGES,
    pair_budget: int | None = None,
    products: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Rewrite the fp32 graph `src` (fused or not) into the per-token INT8 graph `dst`; returns the
    report. `outliers` and `float_after_gelu`: see the module's docstring; `stages`: STAGES;
    `pair_budget`: the largest |w[2j]| + |w[2j+1]| of the int8 weights (None: no bound but 127 each);
    `products`: per quantized input, X^T X to round its weights against (calibration.input_products;
    None: nearest)."""
    import onnx

    if pair_budget is not None and pair_budget < 1:
        raise ValueError(f"pair_budget must be positive, got {pair_budget}")
    model = onnx.load(str(src))
    upgrade_opset(model)
    replaced = _Rewriter(model.graph, outliers, float_after_gelu, stages, pair_budget, products).rewrite()
    if not replaced:
        raise ValueError(f"{src.name} has no MatMul with a constant weight and no Attention node to quantize")
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    ops = Counter(node.op_type for node in model.graph.node)
    return {
        "source": src.name,
        "tool": TOOL,
        "behaviour": BEHAVIOUR,
        "rewritten": replaced,
        "quantized_ops": {op: ops[op] for op in ("MatMulIntegerToFloat", "QuantizeLinear") if ops.get(op)},
        "remaining_float_matmul": ops.get("MatMul", 0) + ops.get("Gemm", 0),
        "outlier_channels": {
            "per_input": max((len(c) for c in (outliers or {}).values()), default=0),
            "inputs": len(outliers or {}),
        },
        "float_after_gelu": float_after_gelu,
        "stages": sorted(stages),
        "weight_pair_budget": pair_budget,
        "weight_rounding": "error feedback (calibration.round_with_feedback)" if products else "nearest",
    }
