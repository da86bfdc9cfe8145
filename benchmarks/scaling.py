"""The FLOP floor that benchmarks/cpu_int8.py sets its targets against, and its random feeds.

The floor is the time the encoder's matrix multiplications need at this CPU's measured peak:
FLOPs are counted analytically (`bert_flops`: projections, attention scores and context, FFN,
pooler and head; one multiply-add = 2 FLOPs; embeddings, LayerNorm, softmax and GELU ignored),
and the peak is the best of numpy fp32 matmul and ONNX Runtime MatMul (fp32) / MatMulInteger
(int8) on large BERT-shaped products with the same thread count. The fused variant is compared
to the fp32 floor; the int8 floor charges the weight matmuls at the int8 peak and the attention
score/context products (which dynamic quantization leaves in fp32) at the fp32 peak. The sweep
of latency against length and batch that used these is retired (docs/decisions.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import bench_common as common
from export.int8_precision import exact_int8


def bert_flops(
    seq_len: int, hidden: int, layers: int, intermediate: int, num_labels: int = 2, batch: int = 1
) -> dict[str, float]:
    """Matmul FLOPs of one BERT forward pass with a [CLS] classification head (multiply-add = 2)."""
    if min(seq_len, hidden, layers, intermediate, batch) < 1:
        raise ValueError("sizes must be positive")
    projections = 4 * 2 * seq_len * hidden * hidden  # Q, K, V and the attention output dense
    attention = 2 * 2 * seq_len * seq_len * hidden  # QK^T scores, then scores x V (all heads together)
    ffn = 2 * 2 * seq_len * hidden * intermediate  # up and down projections
    head = 2 * hidden * hidden + 2 * hidden * num_labels  # pooler and classifier, on [CLS] only
    per_sequence = layers * (projections + attention + ffn) + head
    return {
        "total": float(batch * per_sequence),
        "projections": float(batch * layers * projections),
        "attention": float(batch * layers * attention),
        "ffn": float(batch * layers * ffn),
        "head": float(batch * head),
    }


def sig(value: float, digits: int = 4) -> float:
    """Round to significant digits: tiny test models have microsecond floors."""
    return float(f"{value:.{digits}g}")


def floor_seconds(flops: dict[str, float], precision: str, peak_gflops: dict[str, float]) -> float:
    """Matmul time at peak. int8 dynamic quantization only covers the weight matmuls: the attention
    score and context products stay fp32, so they are charged at the fp32 peak."""
    if precision == "fp32":
        return flops["total"] / (peak_gflops["fp32"] * 1e9)
    weights = flops["total"] - flops["attention"]
    return weights / (peak_gflops["int8"] * 1e9) + flops["attention"] / (peak_gflops["fp32"] * 1e9)


def _median_seconds(fn: Callable[[], object], runs: int, budget_s: float) -> float:
    fn()  # warm-up
    return statistics.median(common.timed(fn, runs, budget_s, min_runs=2)[1])


def _matmul_session(m: int, k: int, n: int, threads: int, int8: bool):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if int8:
        weight = numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "w")
        node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
        x_type, y_type = TensorProto.UINT8, TensorProto.INT32
    else:
        weight = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "w")
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        x_type, y_type = TensorProto.FLOAT, TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "matmul",
        [helper.make_tensor_value_info("x", x_type, [m, k])],
        [helper.make_tensor_value_info("y", y_type, [m, n])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    exact_int8(options)  # the int8 kernel the service runs on this CPU
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = (
        rng.integers(0, 256, (m, k), dtype=np.uint8)
        if int8
        else rng.standard_normal((m, k), dtype=np.float32)
    )
    return lambda: session.run(None, {"x": x})


def measure_peak(
    threads: int, shapes: list[tuple[int, int, int]], runs: int, budget_s: float
) -> dict[str, Any]:
    """Achievable GFLOP/s (fp32) and GOP/s (int8) on BERT-shaped matmuls: the floor's denominator."""
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in shapes:
        flops = 2.0 * m * k * n
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        candidates = {
            ("numpy", "fp32"): lambda a=a, b=b: a @ b,
            ("ort-MatMul", "fp32"): _matmul_session(m, k, n, threads, int8=False),
            ("ort-MatMulInteger", "int8"): _matmul_session(m, k, n, threads, int8=True),
        }
        for (engine, precision), fn in candidates.items():
            seconds = _median_seconds(fn, runs, budget_s)
            rows.append(
                {
                    "engine": engine,
                    "precision": precision,
                    "shape": [m, k, n],
                    "gflops": sig(flops / seconds / 1e9),
                }
            )
    best = {p: max(r["gflops"] for r in rows if r["precision"] == p) for p in ("fp32", "int8")}
    return {"measurements": rows, "peak_gflops": best}


def feeds(batch: int, seq: int, vocab: int = 30522, seed: int = 0) -> dict[str, np.ndarray]:
    """Random full-length rows (no padding); ids skip the low range where special tokens live."""
    low = min(1000, vocab // 4)
    ids = np.random.default_rng(seed).integers(low, vocab, size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
