"""Transformer fusions (onnxruntime.transformers.optimizer) and the fp16 conversion.

The fused graph uses only ORT's basic, provider-independent rewrites (opt_level 1) plus
the Python fusions, so one file runs on CPU and CUDA. Attention keeps the raw 2-D mask
(AttentionMaskFormat.AttentionMask) rather than the default 1-D "mask index", which
silently assumes right padding; a caller that pads on the left still gets right answers.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from model.architectures import architecture
from model.config import BertConfig

_GELU_FUSION = {"gelu": "BiasGelu", "gelu_new": "FastGelu", "gelu_pytorch_tanh": "FastGelu"}
# Ops whose survival in the fused graph explains a missing fusion.
_LEFTOVER_OPS = ("LayerNormalization", "Softmax", "Erf", "Tanh", "Gelu", "Add", "ReduceMean", "Reshape")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# RoBERTa's positions (a CumSum over the non-padding tokens) are outside ORT's embedding pattern:
# its word + position + type sum stays an Add and a LayerNormalization.
EMBEDDING_NOTE = "no EmbedLayerNormalization expected: positions that skip padding (RoBERTa) do not match it"


def expected_fusions(config: BertConfig) -> dict[str, int]:
    layers = config.num_hidden_layers
    expected = {"EmbedLayerNormalization": 1, "Attention": layers, "SkipLayerNormalization": 2 * layers}
    if architecture(config.model_type).positions_skip_padding:
        del expected["EmbedLayerNormalization"]
    if config.hidden_act in _GELU_FUSION:
        expected[_GELU_FUSION[config.hidden_act]] = layers
    return expected


def _reason(op: str, leftovers: Counter, log_lines: list[str]) -> str:
    """Best explanation we can give for a fusion that fired fewer times than expected."""
    hints = [line for line in log_lines if op.lower().replace("normalization", "") in line.lower()]
    if op == "Attention" and leftovers["Softmax"]:
        reason = (
            f"{leftovers['Softmax']} Softmax node(s) remain: the Q/K/V MatMul -> Reshape -> "
            "Transpose -> MatMul -> Div -> Add(mask) -> Softmax pattern was not matched"
        )
    elif op == "BiasGelu" and leftovers["Erf"]:
        reason = f"{leftovers['Erf']} Erf node(s) remain: the erf-Gelu x*0.5*(1+erf(x/sqrt2)) was not matched"
    elif op in ("SkipLayerNormalization", "EmbedLayerNormalization") and leftovers["LayerNormalization"]:
        reason = (
            f"{leftovers['LayerNormalization']} plain LayerNormalization node(s) remain: the residual "
            "Add (or the word+position+segment embedding sum) in front was not matched"
        )
    else:
        reason = "pattern not matched by onnxruntime.transformers"
    return reason + (f" (optimizer log: {' | '.join(hints[-3:])})" if hints else "")


# onnxruntime 1.31's CPU SkipLayerNormalization kernel took 219 us on a 128 x 384 input where
# Add + LayerNormalization took 30 us (one thread; docs/decisions.md): the int8
# MiniLM ran 16-21% faster without it. The CPU-only int8 variant therefore keeps them apart,
# and its sessions must not let onnxruntime fuse them back at load time.
SKIP_LAYER_NORM_NOTE = (
    "residual Add + LayerNormalization left unfused: onnxruntime's CPU SkipLayerNormalization kernel "
    "is several times slower (docs/decisions.md)"
)
CPU_DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def fuse(src: Path, dst: Path, config: BertConfig, skip_layer_norm: bool = True) -> dict[str, Any]:
    """Write the fused graph to `dst` and return the fusion report. `skip_layer_norm=False` keeps
    residual Add + LayerNormalization unfused (see SKIP_LAYER_NORM_NOTE)."""
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.attention_mask_format = AttentionMaskFormat.AttentionMask
    options.enable_skip_layer_norm = skip_layer_norm
    collector = _Collect()
    ort_logger = logging.getLogger("onnxruntime.transformers")
    old_level, old_propagate = ort_logger.level, ort_logger.propagate
    ort_logger.addHandler(collector)
    ort_logger.setLevel(logging.DEBUG)
    ort_logger.propagate = False  # collected into the report, not printed
    try:
        optimized = optimize_model(
            str(src),
            model_type="bert",
            num_heads=config.num_attention_heads,
            hidden_size=config.hidden_size,
            optimization_options=options,
            opt_level=1,
        )
    finally:
        ort_logger.removeHandler(collector)
        ort_logger.setLevel(old_level)
        ort_logger.propagate = old_propagate
    optimized.save_model_to_file(str(dst))
    counts = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    ops = Counter(node.op_type for node in onnx.load(str(dst)).graph.node)
    leftovers = Counter({op: ops[op] for op in _LEFTOVER_OPS if ops.get(op)})
    expected = expected_fusions(config)
    if not skip_layer_norm:
        expected.pop("SkipLayerNormalization", None)
    missing = {
        op: {
            "expected": n,
            "fused": counts.get(op, 0),
            "reason": _reason(op, leftovers, collector.lines),
        }
        for op, n in expected.items()
        if counts.get(op, 0) < n
    }
    notes = []
    if architecture(config.model_type).positions_skip_padding:
        notes.append(EMBEDDING_NOTE)
    if config.hidden_act not in _GELU_FUSION:
        notes.append(f"no Gelu fusion expected: hidden_act {config.hidden_act!r} has no fused op")
    return {
        "tool": "onnxruntime.transformers.optimizer.optimize_model(model_type='bert', opt_level=1)",
        "attention_mask_format": "raw 2-D attention_mask (any padding side)",
        "fused_operator_counts": counts,
        "expected": expected,
        "not_fused": missing,
        "remaining_unfused_ops": dict(leftovers),
        "node_count": sum(ops.values()),
        "all_expected_fused": not missing,
        "notes": notes,
    }


def to_fp16(src: Path, dst: Path) -> dict[str, Any]:
    """fp16 weights and compute for CUDA; int64 inputs and fp32 logits kept (keep_io_types)."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(dst))
    onnx.checker.check_model(str(dst), full_check=True)
    return {
        "source": src.name,
        "tool": "onnxruntime.transformers float16 (keep_io_types=True)",
        "onnx_checker": "passed",
    }
