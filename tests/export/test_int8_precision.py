"""export.int8_precision: exact INT8 matmuls are asked for exactly where the CPU's kernel saturates,
and a session opened with them adds up exactly."""

from __future__ import annotations

import numpy as np
import pytest

from export.int8_precision import X64_QUANT_PRECISION, cpu_flags, exact_int8, needs_exact_int8


class Options:
    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self.entries[key] = value


@pytest.mark.parametrize(
    ("machine", "flags", "needed"),
    [
        ("x86_64", {"avx", "avx2", "fma"}, True),  # AVX2 only: vpmaddubsw saturates
        ("x86_64", {"avx2", "avx512f", "avx512bw"}, True),  # AVX-512 without VNNI saturates too
        ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, False),
        ("x86_64", {"avx2", "avx_vnni"}, False),
        ("x86_64", {"avx2", "amx_tile", "amx_int8"}, False),
        ("aarch64", {"asimd"}, False),  # 32-bit accumulation
    ],
)
def test_asked_only_where_the_kernel_saturates(machine, flags, needed):
    assert needs_exact_int8(machine, flags) is needed
    options = Options()
    assert exact_int8(options, needs_exact_int8(machine, flags)) is needed
    assert options.entries == ({X64_QUANT_PRECISION: "1"} if needed else {})


def test_cpu_flags_reads_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_vnni\n\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_vnni"}
    assert cpu_flags(tmp_path / "absent") == set()


def test_sessions_for_serving_and_evaluation_add_up_exactly():
    """The worst case for a saturating kernel (every code 255, large weights), through the sessions
    the service (app.runtime) and offline evaluation and export checks (export.verify) open: exact on
    any CPU."""
    pytest.importorskip("onnx")
    from app.runtime import session_options
    from benchmarks.int8_exactness import matmul_model, matmul_session
    from export.verify import make_session

    rng = np.random.default_rng(0)
    weights = rng.integers(-127, 128, (64, 16)).astype(np.int8)
    codes = np.full((4, 64), 255, np.uint8)
    exact = (codes.astype(np.int64) - 128) @ weights.astype(np.int64)
    options = session_options(1)
    assert (options.get_session_config_entry(X64_QUANT_PRECISION) == "1") is needs_exact_int8()
    served = matmul_session(weights, None, options)
    np.testing.assert_array_equal(served.run(None, {"codes": codes})[0], exact)
    evaluated = make_session(matmul_model(weights, None), threads=1)
    np.testing.assert_array_equal(evaluated.run(None, {"codes": codes})[0], exact)
