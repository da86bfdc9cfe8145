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


AVX2_ONLY = {"fma", "avx", "avx2"}
WITH_VNNI = {"fma", "avx", "avx2", "avx512f", "avx512bw", "avx512_vnni"}


def config_entry(options, key: str) -> str | None:
    """A SessionOptions entry, or None where it was never set (onnxruntime raises on those)."""
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:
        return None


@pytest.mark.parametrize(("flags", "asked"), [(AVX2_ONLY, True), (WITH_VNNI, False)])
def test_the_service_asks_for_exact_int8_by_the_cpus_flags(monkeypatch, flags, asked):
    """Both CPU classes, whatever CPU runs the suite: the flags are injected."""
    pytest.importorskip("onnxruntime")
    from app.backend.runtime import session_options
    from export import int8_precision

    monkeypatch.setattr(int8_precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda cpuinfo=None: set(flags))
    options = session_options(1)
    assert config_entry(options, X64_QUANT_PRECISION) == ("1" if asked else None)


def matmul_model(weights: np.ndarray) -> bytes:
    """One MatMulIntegerToFloat node, as int8-rowwise runs its matmuls: uint8 codes (zero point
    128) times int8 weights, every scale 1, so its float output is the integer product."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = weights.shape
    initializers = [
        numpy_helper.from_array(weights, "w"),
        numpy_helper.from_array(np.array(1.0, np.float32), "a_scale"),
        numpy_helper.from_array(np.ones(n, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "a_zero_point"),
    ]
    inputs = ["codes", "w", "a_scale", "w_scale", "a_zero_point"]
    node = helper.make_node("MatMulIntegerToFloat", inputs, ["y"], domain="com.microsoft")
    graph = helper.make_graph(
        [node],
        "int8_matmul",
        [helper.make_tensor_value_info("codes", TensorProto.UINT8, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        initializer=initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def worst_case(seed: int = 0):
    """Every code 255 against large weights: where a 16-bit pairwise kernel saturates."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(-127, 128, (64, 16)).astype(np.int8)
    codes = np.full((4, 64), 255, np.uint8)
    return weights, codes, (codes.astype(np.int64) - 128) @ weights.astype(np.int64)


def test_sessions_for_serving_and_evaluation_add_up_exactly():
    """The worst case through the sessions the service (app.backend.runtime) and offline evaluation and
    export checks (export.verify) open, with this CPU's real flags: exact on any CPU, whichever
    branch `needs_exact_int8` takes here."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from app.backend.runtime import session_options
    from export.verify import make_session

    weights, codes, exact = worst_case()
    served = ort.InferenceSession(
        matmul_model(weights), session_options(1), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_array_equal(served.run(None, {"codes": codes})[0], exact)
    evaluated = make_session(matmul_model(weights), threads=1)
    np.testing.assert_array_equal(evaluated.run(None, {"codes": codes})[0], exact)


def test_the_exact_kernel_is_exact_on_any_cpu(monkeypatch):
    """The branch taken on AVX2-only CPUs (`session.x64quantprecision`), forced on whatever CPU runs
    the suite: its widening kernel adds up exactly everywhere, so asking for it is always safe."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from app.backend.runtime import session_options
    from export import int8_precision
    from export.verify import make_session

    monkeypatch.setattr(int8_precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda cpuinfo=None: set(AVX2_ONLY))
    weights, codes, exact = worst_case(1)
    options = session_options(1)
    assert config_entry(options, X64_QUANT_PRECISION) == "1"
    served = ort.InferenceSession(matmul_model(weights), options, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(served.run(None, {"codes": codes})[0], exact)
    evaluated = make_session(matmul_model(weights), threads=1)
    np.testing.assert_array_equal(evaluated.run(None, {"codes": codes})[0], exact)


def pairwise_16_bit(codes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """What the x86 u8 x s8 kernels without VNNI compute (vpmaddubsw, then vpmaddwd by ones): each
    pair of adjacent products along K summed and saturated to int16, the pairs then summed in int32.
    The zero point is taken off afterwards from column sums, so the kernel sees the raw uint8 codes."""
    a = codes.astype(np.int64)[:, :, None]  # [M, K, 1]
    w = weights.astype(np.int64)[None]  # [1, K, N]
    products = a * w  # [M, K, N]
    pairs = products[:, 0::2] + products[:, 1::2]  # [M, K/2, N]
    raw = np.clip(pairs, -32768, 32767).sum(1)  # [M, N]
    return raw - 128 * weights.astype(np.int64).sum(0)  # the zero point's correction, exact


def extreme_weights(peak: int) -> np.ndarray:
    """Columns of +peak, -peak, and every sign pattern of a pair: the extremes of a linear bound."""
    signs = np.array([[1, 1], [-1, -1], [1, -1], [-1, 1]])  # [4, 2]: one pair's signs per column
    return (peak * np.tile(signs.T, (32, 1))).astype(np.int8)  # [64, 4]


@pytest.mark.parametrize("peak", [127, 65])
def test_the_pairwise_kernel_saturates_beyond_64(peak):
    """All-255 activations against weights of 127 or 65: a pair overflows 16 bits (255 x 65 x 2 =
    33,150), so the emulated kernel is off; this is the check the 7-bit bound must pass."""
    codes = np.full((2, 64), 255, np.uint8)
    weights = extreme_weights(peak)
    exact = (codes.astype(np.int64) - 128) @ weights.astype(np.int64)
    assert (pairwise_16_bit(codes, weights) != exact).any()


def test_7_bit_weights_are_exact_on_the_pairwise_kernel():
    """The worst cases for int8-rowwise-7bit: every activation code 0 or 255 (the raw codes the kernel
    multiplies; 128 is the zero point) against every sign pattern of ±64 weights, and random codes."""
    from export.int8_precision import PAIR_SAFE_WEIGHT
    from export.quantize_rowwise import quantize_weight

    assert PAIR_SAFE_WEIGHT == 64 and 255 * 64 * 2 <= 32767 < 255 * 65 * 2
    weights = extreme_weights(PAIR_SAFE_WEIGHT)
    rows = [np.full(64, 255), np.zeros(64), np.tile([255, 0], 32), np.tile([0, 255], 32)]
    rng = np.random.default_rng(0)
    codes = np.concatenate([np.stack(rows), rng.integers(0, 256, (60, 64))]).astype(np.uint8)
    exact = (codes.astype(np.int64) - 128) @ weights.astype(np.int64)
    np.testing.assert_array_equal(pairwise_16_bit(codes, weights), exact)
    # The variant's quantizer never leaves the bound, whatever the weights (a column of one outlier).
    w = rng.standard_normal((64, 8)).astype(np.float32)
    w[3, 2] = 40.0
    q, _ = quantize_weight(w, PAIR_SAFE_WEIGHT)
    assert np.abs(q.astype(int)).max() == PAIR_SAFE_WEIGHT
    np.testing.assert_array_equal(
        pairwise_16_bit(codes, q), (codes.astype(np.int64) - 128) @ q.astype(np.int64)
    )


def test_the_7_bit_variant_is_served_without_the_widening_kernel(monkeypatch):
    """On an AVX2-only CPU (injected flags) the service opens int8-rowwise-7bit on the fast kernel and
    int8-rowwise on the exact widening one; the worst case adds up exactly on the 7-bit one with this
    CPU's real kernel (the fast non-VNNI one where the suite runs on such a CPU)."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from app.backend.runtime import session_options
    from export import int8_precision

    monkeypatch.setattr(int8_precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda cpuinfo=None: set(AVX2_ONLY))
    assert config_entry(session_options(1, variant="int8-rowwise"), X64_QUANT_PRECISION) == "1"
    options = session_options(1, variant="int8-rowwise-7bit")
    assert config_entry(options, X64_QUANT_PRECISION) is None
    weights = extreme_weights(64)
    codes = np.full((4, 64), 255, np.uint8)
    served = ort.InferenceSession(matmul_model(weights), options, providers=["CPUExecutionProvider"])
    exact = (codes.astype(np.int64) - 128) @ weights.astype(np.int64)
    np.testing.assert_array_equal(served.run(None, {"codes": codes})[0], exact)


QEMU_SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort
from tests.export.test_int8_precision import extreme_weights, matmul_model

codes = np.full((4, 64), 255, np.uint8)
for peak in (127, 64):
    weights = extreme_weights(peak)
    exact = (codes.astype(np.int64) - 128) @ weights.astype(np.int64)
    session = ort.InferenceSession(matmul_model(weights), providers=["CPUExecutionProvider"])
    print(peak, int(np.abs(session.run(None, {"codes": codes})[0] - exact).max()))
"""


def test_the_real_avx2_kernel_under_emulation():
    """onnxruntime's own AVX2 u8 x s8 kernel, on this machine: qemu-user emulates a Haswell CPU (AVX2,
    no VNNI), so MLAS dispatches to its non-VNNI kernel. 8-bit weights must come out wrong there
    (proof that the emulated path is the saturating one) and 7-bit weights exact. Not for timing."""
    import platform
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("qemu-x86_64 (apt-get install qemu-user) is needed to emulate an AVX2-only CPU")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [qemu, "-cpu", "Haswell", sys.executable, "-c", QEMU_SCRIPT],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    errors = dict(line.split() for line in result.stdout.split("\n") if line.strip())
    assert int(errors["127"]) > 0, "the emulated CPU took an exact kernel: not the AVX2 path"
    assert errors["64"] == "0"
