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
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

X64_QUANT_PRECISION = "session.x64quantprecision"
# int32 dot products of u8 x s8: no 16-bit intermediate to saturate.
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


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


def exact_int8(options: Any, needed: bool | None = None) -> bool:
    """Ask `options` (an onnxruntime SessionOptions) for exact INT8 matmuls where this CPU needs it;
    returns whether it was asked."""
    if needed is None:
        needed = needs_exact_int8()
    if needed:
        options.add_session_config_entry(X64_QUANT_PRECISION, "1")
    return needed
