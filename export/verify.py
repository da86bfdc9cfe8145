"""Parity checks: PyTorch vs ONNX Runtime on shapes the trace never saw.

The cases cover batch 1 / sequence 1, the full max_seq_len, a batch of right-padded rows
of mixed lengths (plus a second segment) and a left-padded batch, so a sequence length
or batch size baked into the graph, or a broken attention mask, shows up as a failure.
Token-level outputs (ner, qa, embed's token states) are compared at real tokens only: padded
positions carry no meaning and the fused attention kernel is free to compute them differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from processing.tasks import TASKS

from .bundle import INPUT_NAMES
from .int8_precision import exact_int8

FP32_TOLERANCE = 1e-4


class VerificationError(RuntimeError):
    pass


@dataclass
class Case:
    name: str
    feeds: dict[str, np.ndarray]


def _random_batch(
    task: str,
    lengths: list[list[int]] | list[int],
    seq: int,
    vocab_size: int,
    rng: np.random.Generator,
    second_segment: bool = False,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """Right-padded random-token features, padded with `pad_id` (RoBERTa counts positions past it);
    `lengths` is [batch] or [batch][choices]."""
    lengths_arr = np.asarray(lengths)
    if TASKS[task].choices and lengths_arr.ndim == 1:
        lengths_arr = lengths_arr[:, None]
    positions = np.arange(seq)
    mask = (positions < lengths_arr[..., None]).astype(np.int64)
    input_ids = np.where(mask == 1, rng.integers(1, vocab_size, size=mask.shape, dtype=np.int64), pad_id)
    token_type_ids = np.zeros_like(input_ids)
    if second_segment:
        # Second half of each real span is segment B, as for a text pair.
        token_type_ids = ((positions >= (lengths_arr[..., None] // 2)) & (mask == 1)).astype(np.int64)
    return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": token_type_ids}


def verification_cases(
    task: str, vocab_size: int, max_seq_len: int, seed: int = 0, pad_id: int = 0
) -> list[Case]:
    rng = np.random.default_rng(seed)

    def _batch(*args, **kwargs):
        return _random_batch(*args, **kwargs, pad_id=pad_id)

    mid = min(max_seq_len, 23)
    mixed = [mid, max(1, mid // 2), 1]
    if TASKS[task].choices:
        return [
            Case("batch1_choices1_seq1", _batch(task, [[1]], 1, vocab_size, rng)),
            Case(
                "batch1_choices2_max_seq_len",
                _batch(task, [[max_seq_len] * 2], max_seq_len, vocab_size, rng),
            ),
            Case(
                "batch3_choices4_padded_mixed_lengths",
                _batch(task, [[mid, 1, mid // 2 + 1, mid]] * 3, mid, vocab_size, rng, second_segment=True),
            ),
        ]
    short = min(max_seq_len, 7)
    left_padded = _batch(task, [short, max(1, short - 3)], short, vocab_size, rng, second_segment=True)
    return [
        Case("batch1_seq1", _batch(task, [1], 1, vocab_size, rng)),
        Case("batch1_max_seq_len", _batch(task, [max_seq_len], max_seq_len, vocab_size, rng, True)),
        Case("batch3_padded_mixed_lengths", _batch(task, mixed, mid, vocab_size, rng, second_segment=True)),
        Case("batch5_seq7", _batch(task, [short, short, 3, short, 5], short, vocab_size, rng)),
        # Padding on the left: the fused graph reads the raw mask, so this must hold too.
        Case("batch2_left_padded", {k: np.ascontiguousarray(v[:, ::-1]) for k, v in left_padded.items()}),
    ]


def random_eval_batches(
    task: str,
    vocab_size: int,
    max_seq_len: int,
    n_batches: int = 8,
    batch_size: int = 16,
    seed: int = 1,
    pad_id: int = 0,
) -> list[dict[str, np.ndarray]]:
    """Stand-in evaluation features (random tokens, mixed lengths) when the caller gives none."""
    rng = np.random.default_rng(seed)
    seq = min(max_seq_len, 64)
    batches = []
    for _ in range(n_batches):
        shape = (batch_size, 4) if TASKS[task].choices else (batch_size,)
        lengths = rng.integers(max(1, seq // 4), seq + 1, size=shape)
        batches.append(_random_batch(task, lengths.tolist(), seq, vocab_size, rng, True, pad_id))
    return batches


def token_level(task: str) -> bool:
    return TASKS[task].per_token


def valid(task: str, output: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The entries of `output` that mean something: real tokens for ner / qa, all otherwise."""
    return output[mask.astype(bool)] if token_level(task) else output


def max_abs_diff(
    task: str, ref: dict[str, np.ndarray], got: dict[str, np.ndarray], mask: np.ndarray
) -> dict[str, float]:
    diffs = {}
    for name, expected in ref.items():
        if got[name].shape != expected.shape:
            raise VerificationError(f"output {name}: shape {got[name].shape}, PyTorch gives {expected.shape}")
        delta = np.abs(valid(task, got[name].astype(np.float64), mask) - valid(task, expected, mask))
        diffs[name] = float(delta.max()) if delta.size else 0.0
    return diffs


def make_session(
    model: Path | bytes, threads: int = 0, disabled_optimizers: Sequence[str] = (), variant: str | None = None
):
    """A CPU session on an ONNX file (or serialized model), with a bundle variant's
    disabled_optimizers when given, on the INT8 kernel the service takes for `variant`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    exact_int8(options, variant=variant)  # as the service opens it: exact INT8 on every CPU
    extra = {"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"], **extra)


def run_session(session, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    # The graph's own inputs: a model with one token type (RoBERTa) or none reads no token_type_ids.
    feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
    return dict(zip(names, session.run(names, feeds), strict=True))


def run_torch(wrapper, output_names: list[str], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    with torch.no_grad():
        out = wrapper(*(torch.from_numpy(feeds[n]) for n in INPUT_NAMES))
    out = out if isinstance(out, tuple) else (out,)
    return {name: t.float().numpy() for name, t in zip(output_names, out, strict=True)}


def compare_variant(
    task: str,
    path: Path,
    cases: list[Case],
    references: list[dict[str, np.ndarray]],
    tolerance: float | None,
    disabled_optimizers: Sequence[str] = (),
) -> dict[str, Any]:
    """Run `path` on every case and report the worst difference against the references.

    `tolerance=None` records the differences without judging them (passed is None).
    """
    session = make_session(path, disabled_optimizers=disabled_optimizers)
    rows, worst = [], 0.0
    for case, ref in zip(cases, references, strict=True):
        got = run_session(session, case.feeds)
        diffs = max_abs_diff(task, ref, got, case.feeds["attention_mask"])
        if not all(np.isfinite(v) for v in diffs.values()):
            # NaN / inf outputs: JSON has no inf, and nothing passes a 1e300 bound.
            diffs = {k: 1e300 for k in diffs}
        worst = max(worst, *diffs.values())
        rows.append({"case": case.name, "shape": list(case.feeds["input_ids"].shape), "max_abs_diff": diffs})
    passed = None if tolerance is None else bool(worst <= tolerance)
    return {"tolerance": tolerance, "max_abs_diff": worst, "passed": passed, "cases": rows}


def require_passed(variant: str, report: dict[str, Any]) -> None:
    if report["passed"]:
        return
    bad = [
        f"{row['case']} {row['shape']}: {max(row['max_abs_diff'].values()):.3g}"
        for row in report["cases"]
        if max(row["max_abs_diff"].values()) > report["tolerance"]
    ]
    raise VerificationError(
        f"{variant} ONNX graph disagrees with PyTorch beyond {report['tolerance']:g} (max abs diff): "
        + "; ".join(bad)
    )


# fp16 keeps ~3 significant digits; the bound is relative to the largest reference logit.
FP16_RELATIVE_TOLERANCE = 1e-2


def fp16_check(task: str, path: Path, cases, references) -> dict[str, Any]:
    """fp16 targets CUDA; ORT CPU may lack fp16 kernels, in which case we only say so."""
    try:
        report = compare_variant(task, path, cases, references, tolerance=None)
    except Exception as e:  # ORT raises its own exception types (NOT_IMPLEMENTED, ...)
        return {"passed": None, "status": f"not verified on CPU: {type(e).__name__}: {str(e)[:300]}"}
    scale = max(1.0, *(float(np.abs(v).max()) for ref in references for v in ref.values()))
    report["tolerance"] = FP16_RELATIVE_TOLERANCE * scale
    report["passed"] = report["max_abs_diff"] <= report["tolerance"]
    report["status"] = "verified with ORT CPU (CUDA not tested here)"
    return report
