"""What the per-token INT8 rewrite (export/quantize_rowwise.py) learns from data, all fixed at export
so a row's outputs still depend on that row alone:

- `outlier_channels`: the hidden channels an fp32 matmul carries beside the INT8 one (the embed recipe);
- `input_products`: each quantized input's X^T X over real tokens, which `round_with_feedback` weighs
  the weight errors by. `int8-rowwise-avx2` rounds this way: its pair budget (int8_precision) costs
  each column precision, and feeding every rounding error forward into the K rows not yet rounded
  (GPTQ, Frantar et al. 2022) buys it back. The statistics come from `text_batches`, features cut from
  CALIBRATION_TEXT (prose written for this repository), not from the data the bundle is judged on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .int8_precision import pair_load

MS_DOMAIN = "com.microsoft"  # onnxruntime's own ops (Attention, MatMulIntegerToFloat, ...)
CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")
# How int8-rowwise-avx2's codes are rounded (export_bundle's `avx2_rounding`).
AVX2_ROUNDINGS = ("feedback", "nearest")
# Enough tokens (8 x 16 rows of 12-256, about 9,000) that X^T X of a 1,536-wide FFN input has full rank.
BATCHES, ROWS, SHORTEST, LONGEST = 8, 16, 12, 256
DAMPING = 0.01  # of X^T X's mean diagonal, added to it: channels seen little still get rounded sensibly
BLOCK = 128  # K rows rounded at a time before their errors reach the rest in one matmul


def text_batches(
    task: str, tokenizer, max_seq_len: int, text: str | None = None, seed: int = 1
) -> list[dict[str, np.ndarray]]:
    """Model inputs cut from `text` (default CALIBRATION_TEXT), laid out with the tokenizer's own
    special tokens: rows of SHORTEST to min(max_seq_len, LONGEST) tokens, log-uniform (short inputs
    are the common ones), half of them pairs of a line's start (a question, a sentence) and the text
    after that line (a passage)."""
    from processing.tasks import TASKS
    from processing.tokenizer import Tokens

    lines = [
        line for line in (text or CALIBRATION_TEXT.read_text(encoding="utf-8")).splitlines() if line.strip()
    ]
    parts = tokenizer.tokenize_batch(lines)
    starts = np.cumsum([0] + [len(p) for p in parts])  # each line's first token in the stream
    stream = Tokens(*(np.concatenate([getattr(t, f) for t in parts]) for f in ("ids", "offsets", "word_ids")))
    seq = min(max_seq_len, LONGEST)
    if len(lines) < 2 or len(stream) < seq:
        raise ValueError(
            f"calibration text has {len(lines)} lines and {len(stream)} tokens, fewer than one "
            f"{seq}-token window or two lines"
        )
    rng = np.random.default_rng(seed)
    shape = (ROWS, 4) if TASKS[task].choices else (ROWS,)
    batches = []
    for _ in range(BATCHES):
        ids = np.full((*shape, seq), tokenizer.pad_id, np.int64)  # [rows(, choices), seq]
        types, mask = np.zeros_like(ids), np.zeros_like(ids)
        for row in np.ndindex(*shape):
            pair = rng.random() < 0.5
            length = int(np.exp(rng.uniform(np.log(min(SHORTEST, seq)), np.log(seq + 1))))
            pair = pair and length >= tokenizer.n_special(True) + 2  # a token each side
            body = max(0, length - tokenizer.n_special(pair))
            if pair:
                line = int(rng.integers(0, len(parts) - 1))
                first = parts[line].slice(0, max(1, min(len(parts[line]), body // 3)))
                rest = body - len(first)
                after = min(int(starts[line + 1]), len(stream) - rest)
                encoding = tokenizer.build(first, stream.slice(after, after + rest))
            else:
                start = int(rng.integers(0, len(stream) - body + 1))
                encoding = tokenizer.build(stream.slice(start, start + body))
            n = len(encoding)
            ids[row][:n], types[row][:n], mask[row][:n] = encoding.input_ids, encoding.token_type_ids, 1
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    return batches


def quantized_inputs(graph) -> dict[str, int]:
    """The tensors the rewrite quantizes (inputs of constant-weight MatMuls and Attention), and
    their width."""
    from onnx import numpy_helper

    weights = {i.name: i for i in graph.initializer}
    out = {}
    for node in graph.node:
        plain = node.op_type == "MatMul" or (node.op_type == "Attention" and node.domain == MS_DOMAIN)
        if plain and len(node.input) > 1 and node.input[1] in weights:
            shape = numpy_helper.to_array(weights[node.input[1]]).shape
            if len(shape) == 2:
                out[node.input[0]] = int(shape[0])
    return out


def token_rows(
    src: Path, batches: list[dict[str, np.ndarray]], disabled_optimizers=()
) -> Iterator[dict[str, np.ndarray]]:
    """Per batch, every quantized input of the fp32 graph `src` as rows [tokens, width], padding
    dropped where the rows are tokens (it carries no meaning)."""
    import onnx
    from onnx import TensorProto, helper

    from .verify import make_session

    model = onnx.load(str(src))
    widths = quantized_inputs(model.graph)
    graph_outputs = {o.name for o in model.graph.output}
    for name in widths:
        if name not in graph_outputs:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = make_session(model.SerializeToString(), disabled_optimizers=disabled_optimizers)
    names = [o.name for o in session.get_outputs()]
    for feeds in batches:
        graph_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
        outputs = dict(zip(names, session.run(names, graph_feeds), strict=True))
        real = feeds["attention_mask"].reshape(-1).astype(bool)
        rows = {}
        for name, width in widths.items():
            rows[name] = outputs[name].reshape(-1, width)  # [tokens (or rows), width]
            if len(rows[name]) == len(real):
                rows[name] = rows[name][real]
        yield rows


def channel_peaks(src: Path, batches: list[dict[str, np.ndarray]], disabled_optimizers=()) -> dict:
    """For every quantized input of `src`, each channel's largest |value| over the real tokens."""
    peak: dict[str, np.ndarray] = {}
    for rows in token_rows(src, batches, disabled_optimizers):
        for name, x in rows.items():
            peak[name] = np.maximum(peak.get(name, 0.0), np.abs(x).max(axis=0)).astype(np.float32)
    return peak


def outlier_channels(src: Path, batches: list[dict[str, np.ndarray]], k: int, disabled_optimizers=()) -> dict:
    """For every quantized input of `src`, the `k` channels of largest |value| over the real tokens
    of `batches`."""
    peak = channel_peaks(src, batches, disabled_optimizers)
    return {name: np.sort(np.argsort(-values)[:k]).astype(np.int64) for name, values in peak.items()}


def input_products(src: Path, batches: list[dict[str, np.ndarray]], disabled_optimizers=()) -> dict:
    """For every quantized input of `src`, X^T X [width, width] (float64) over the real tokens."""
    products: dict[str, np.ndarray] = {}
    for rows in token_rows(src, batches, disabled_optimizers):
        for name, x in rows.items():
            x = x.astype(np.float64)
            products[name] = products.get(name, 0.0) + x.T @ x
    return products


def round_with_feedback(
    weight: np.ndarray, scales: np.ndarray, product: np.ndarray, pair_budget: int | None = None
) -> np.ndarray:
    """int8 codes [K, N] for weight [K, N] at per-column `scales`, chosen to keep X.W where X^T X is
    `product`: K rows are rounded in order, and each row's error is spread over the rows still to
    come through the inverse of X^T X (GPTQ). With `pair_budget`, a row 2j+1 that would take a
    same-signed pair with row 2j past it gets the largest code the budget leaves. Channels X never
    uses (zero diagonal, e.g. outliers an fp32 matmul carries) get code 0."""
    k, n = weight.shape
    w = weight.astype(np.float64)
    h = np.array(product, np.float64)
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w[dead] = 0.0
    h[np.diag_indices(k)] += DAMPING * np.mean(np.diag(h))
    # Upper Cholesky factor of (X^T X)^-1: row i says how row i's error moves the rows after it.
    upper = np.linalg.cholesky(np.linalg.inv(h)).T  # [K, K]
    codes = np.zeros((k, n), np.int64)
    for first in range(0, k, BLOCK):
        last = min(first + BLOCK, k)
        block = w[first:last].copy()  # [rows, N]
        errors = np.zeros_like(block)
        for i in range(last - first):
            row = first + i
            c = np.clip(np.rint(block[i] / scales), -127, 127)
            if pair_budget is not None and row % 2:
                prev = codes[row - 1]
                over = pair_load(np.stack([prev, c]))[0] > pair_budget  # same-signed, past the budget
                c = np.where(over, np.sign(c) * (pair_budget - np.abs(prev)), c)
            codes[row] = c
            errors[i] = (block[i] - c * scales) / upper[row, row]
            block[i + 1 :] -= np.outer(upper[row, row + 1 : last], errors[i])
        w[last:] -= upper[first:last, last:].T @ errors  # [K - last, N]
    return codes.astype(np.int8)
