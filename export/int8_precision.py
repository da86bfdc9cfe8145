"""Exact INT8 matmuls on every x86 CPU, so each quantized variant answers alike on every machine.

onnxruntime multiplies uint8 activations by int8 weights (int8-rowwise's MatMulIntegerToFloat,
dynamic INT8's matmuls) with VNNI's or AMX's int32 dot products where the CPU has them: exact.
Without them (AVX2, AVX-512 without VNNI) it adds pairs of products in 16 bits, which saturate
(255 x 127 x 2 > 32,767): on an AVX2-only EPYC one [128, 384] x [384, 1536] matmul was off by up to
111,651 (docs/decisions.md), and the defaults lost up to 0.85 F1. onnxruntime's
`session.x64quantprecision` rewrites the int8 weights to uint8 at load, which takes an exact
widening kernel. It is asked for only where the CPU lacks VNNI/AMX: there it restores exactness,
elsewhere the fast kernel already is exact. Serving (app.engine.runtime) and offline evaluation and
export checks (export.verify) both open their sessions through `exact_int8`.

The widening kernel costs about as much as fp32 on an AVX2-only CPU. `int8-rowwise-avx2` needs none
of it. The non-VNNI kernels (vpmaddubsw) multiply 4 consecutive K values of a weight column at a time
and add the products of K rows (2j, 2j + 1) in 16 bits. With uint8 activations (0..255) such a sum
lies between -255 x (the pair's negative weights' magnitudes) and 255 x (its positive weights), so a
pair of opposite signs can never saturate, and a pair of one sign cannot once |w[2j]| + |w[2j+1]| <=
PAIR_BUDGET = 128 (255 x 128 = 32,640). That variant's weights keep this `pair_load` in every column;
a single weight, and an opposite-signed pair, may still reach 127 (a plain [-64, 64] bound would also
be exact, pairing aside, but left the embedding default's vectors below its cosine bar:
docs/decisions.md, int8_avx2). `exact_int8` asks for nothing on such a variant, and
`cpu_int8_variant` says which batch-invariant INT8 variant is exact at full speed on this CPU.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

X64_QUANT_PRECISION = "session.x64quantprecision"
# int32 dot products of u8 x s8: no 16-bit intermediate to saturate.
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
# The pair_load of a column's adjacent K rows, at most: 255 x 128 = 32,640 <= 32,767 (and -32,640 >=
# -32,768), so the non-VNNI kernels' 16-bit pair sums never saturate.
PAIR_BUDGET = 128
# Variants whose int8 weights keep PAIR_BUDGET (export checks it): exact on every x86 u8 x s8 kernel
# without the widening one.
PAIR_SAFE_VARIANTS = frozenset({"int8-rowwise-avx2"})
# The batch-invariant INT8 variant each kernel class runs exactly at full speed (docs/decisions.md,
# int8_avx2): 8-bit weights where the dot products are 32-bit, pair-budget ones where pairs add in 16 bits.
INT8_FOR_INT32_DOTS, INT8_FOR_16_BIT_PAIRS = "int8-rowwise", "int8-rowwise-avx2"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU feature flags the kernel reports (empty where there is no /proc/cpuinfo)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def needs_exact_int8(machine: str | None = None, flags: set[str] | None = None) -> bool:
    """True on an x86 CPU whose u8 x s8 matmul kernel saturates (no VNNI, no AMX)."""
    machine = (machine or platform.machine()).lower()
    if machine not in X86:
        return False  # Arm's sdot/udot and others accumulate in 32 bits
    return not (INT8_DOT_FLAGS & (cpu_flags() if flags is None else flags))


def cpu_int8_variant(machine: str | None = None, flags: set[str] | None = None) -> tuple[str, str]:
    """The batch-invariant INT8 variant that is exact on this CPU's fast u8 x s8 kernel, and why."""
    if needs_exact_int8(machine, flags):
        return INT8_FOR_16_BIT_PAIRS, (
            "this CPU's u8 x s8 kernel adds pairs of products in 16 bits (no VNNI/AMX): "
            "weights whose adjacent same-signed pairs stay within 128 keep it exact "
            "without the slow widening kernel"
        )
    return (
        INT8_FOR_INT32_DOTS,
        "this CPU's u8 x s8 kernel adds in 32 bits (VNNI/AMX, or not x86): 8-bit weights are exact",
    )


def exact_int8(options: Any, needed: bool | None = None, variant: str | None = None) -> bool:
    """Ask `options` (an onnxruntime SessionOptions) for exact INT8 matmuls where this CPU needs it
    for `variant` (a PAIR_SAFE_VARIANTS graph never does); returns whether it was asked."""
    if needed is None:
        needed = variant not in PAIR_SAFE_VARIANTS and needs_exact_int8()
    if needed:
        options.add_session_config_entry(X64_QUANT_PRECISION, "1")
    return needed


INTEGER_MATMULS = ("MatMulIntegerToFloat", "MatMulInteger", "DynamicQuantizeMatMul")


def pair_load(weights: Any) -> Any:
    """Per pair of adjacent K rows of a [K, N] array (K padded with a zero row), the larger of its
    positive entries' sum and its negative entries' magnitudes' sum: [ceil(K / 2), N]. A pair's
    16-bit sum with uint8 activations lies within 255 x this (opposite signs partly cancel)."""
    import numpy as np

    w = np.asarray(weights)
    w = w.astype(np.int32) if w.dtype.kind in "iu" else w
    if len(w) % 2:
        w = np.concatenate([w, np.zeros((1, *w.shape[1:]), w.dtype)])
    pos, neg = np.maximum(w, 0), np.maximum(-w, 0)
    return np.maximum(pos[0::2] + pos[1::2], neg[0::2] + neg[1::2])


def pair_peak(codes: Any) -> int:
    """The largest pair_load over a [K, N] int8 weight's columns."""
    return int(pair_load(codes).max(initial=0))


def int8_pair_peak(graph: Any) -> int:
    """pair_peak over the int8 weights of an ONNX graph's integer matmuls (0 if none)."""
    import numpy as np
    from onnx import numpy_helper

    weights = {i.name: i for i in graph.initializer}
    peak = 0
    for node in graph.node:
        if node.op_type in INTEGER_MATMULS and len(node.input) > 1 and node.input[1] in weights:
            codes = numpy_helper.to_array(weights[node.input[1]])
            if codes.dtype == np.int8 and codes.ndim == 2:
                peak = max(peak, pair_peak(codes))
    return peak


def require_pair_safe(variant: str, path: Path) -> int:
    """int8_pair_peak of the ONNX file `path`; raises ValueError where `variant` is in
    PAIR_SAFE_VARIANTS (served without the widening kernel) and a pair exceeds PAIR_BUDGET."""
    import onnx

    peak = int8_pair_peak(onnx.load(str(path)).graph)
    if variant in PAIR_SAFE_VARIANTS and peak > PAIR_BUDGET:
        raise ValueError(
            f"{variant} must keep |w[2j]| + |w[2j+1]| <= {PAIR_BUDGET} in its int8 weights' same-signed "
            f"pairs (its pairs of products then fit 16 bits), but {path.name} holds {peak}"
        )
    return peak
