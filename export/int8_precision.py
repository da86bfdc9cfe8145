"""Exact INT8 matmuls on every x86 CPU, so a quantized model answers alike on every machine.

onnxruntime multiplies uint8 activations by int8 weights (int8-rowwise's MatMulIntegerToFloat,
dynamic INT8's matmuls) with VNNI's or AMX's int32 dot products where the CPU has them: exact.
Without them (AVX2, AVX-512 without VNNI) it adds pairs of products in 16 bits, which saturate
(255 x 127 x 2 > 32,767): on an AVX2-only EPYC one [128, 384] x [384, 1536] matmul was off by up to
111,651 (docs/decisions.md), and the defaults lost up to 0.85 F1. onnxruntime's
`session.x64quantprecision` rewrites the int8 weights to uint8 at load, which takes an exact
widening kernel. It is asked for only where the CPU lacks VNNI/AMX: there it restores exactness,
elsewhere the fast kernel already is exact. Serving (app.backend.runtime) and offline evaluation and
export checks (export.verify) both open their sessions through `exact_int8`.

The widening kernel costs about as much as fp32 on an AVX2-only CPU. `int8-rowwise-7bit` needs none
of it: its int8 weights lie in [-64, 64], so a pair of products of uint8 activations adds up to at
most 255 x 64 x 2 = 32,640 in magnitude, which 16 bits hold (whatever the pairing, since the bound
holds for every pair). `exact_int8` asks for nothing on such a variant, and `cpu_int8_variant` says
which batch-invariant INT8 variant is exact at full speed on this CPU.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

X64_QUANT_PRECISION = "session.x64quantprecision"
# int32 dot products of u8 x s8: no 16-bit intermediate to saturate.
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
# The largest |int8 weight| whose pairs of products with uint8 activations fit the 16-bit sums of the
# non-VNNI kernels (vpmaddubsw): 255 x 64 x 2 = 32,640 <= 32,767 (and -32,640 >= -32,768).
PAIR_SAFE_WEIGHT = 64
# Variants whose every int8 weight is within PAIR_SAFE_WEIGHT (export checks it): exact on every
# x86 u8 x s8 kernel without the widening one.
PAIR_SAFE_VARIANTS = frozenset({"int8-rowwise-7bit"})
# The batch-invariant INT8 variant each kernel class runs exactly at full speed (docs/decisions.md,
# int8_avx2): 8-bit weights where the dot products are 32-bit, 7-bit ones where pairs add in 16 bits.
INT8_FOR_INT32_DOTS, INT8_FOR_16_BIT_PAIRS = "int8-rowwise", "int8-rowwise-7bit"


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
            "7-bit weights keep it exact without the slow widening kernel"
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


def int8_weight_peak(graph: Any) -> int:
    """The largest |code| among the int8 weights of an ONNX graph's integer matmuls (0 if none):
    what export checks against PAIR_SAFE_WEIGHT for a PAIR_SAFE_VARIANTS graph."""
    import numpy as np
    from onnx import numpy_helper

    weights = {i.name: i for i in graph.initializer}
    peak = 0
    for node in graph.node:
        if node.op_type in INTEGER_MATMULS and len(node.input) > 1 and node.input[1] in weights:
            codes = numpy_helper.to_array(weights[node.input[1]])
            if codes.dtype == np.int8 and codes.size:
                peak = max(peak, int(np.abs(codes.astype(np.int16)).max()))
    return peak


def require_pair_safe(variant: str, path: Path) -> int:
    """The largest |int8 weight| of the ONNX file `path`; raises ValueError where `variant` is in
    PAIR_SAFE_VARIANTS (served without the widening kernel) and a weight exceeds PAIR_SAFE_WEIGHT."""
    import onnx

    peak = int8_weight_peak(onnx.load(str(path)).graph)
    if variant in PAIR_SAFE_VARIANTS and peak > PAIR_SAFE_WEIGHT:
        raise ValueError(
            f"{variant} must keep its int8 weights within ±{PAIR_SAFE_WEIGHT} (its pairs of products then "
            f"fit 16 bits), but {path.name} holds {peak}"
        )
    return peak
