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
    from app.engine.runtime import session_options
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
    """The worst case through the sessions the service (app.engine.runtime) and offline evaluation and
    export checks (export.verify) open, with this CPU's real flags: exact on any CPU, whichever
    branch `needs_exact_int8` takes here."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from app.engine.runtime import session_options
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
    from app.engine.runtime import session_options
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


def pairwise_16_bit(codes: np.ndarray, weights: np.ndarray, offset: int = 0) -> np.ndarray:
    """What the x86 u8 x s8 kernels without VNNI compute (vpmaddubsw, then vpmaddwd by ones): the
    products of K rows (2j, 2j + 1) summed and saturated to int16, the pairs then summed in int32
    (`offset` 1 pairs rows (2j + 1, 2j + 2) instead: a kernel that paired otherwise). The zero point is
    taken off afterwards from column sums, so the kernel sees the raw uint8 codes."""
    k = codes.shape[1]
    a = np.pad(codes.astype(np.int64), ((0, 0), (offset, (k + offset) % 2)))[:, :, None]  # [M, K', 1]
    w = np.pad(weights.astype(np.int64), ((offset, (k + offset) % 2), (0, 0)))[None]  # [1, K', N]
    products = a * w  # [M, K', N], K' even
    raw = np.clip(products[:, 0::2] + products[:, 1::2], -32768, 32767).sum(1)  # [M, N]
    return raw - 128 * weights.astype(np.int64).sum(0)  # the zero point's correction, exact


def budget_weights(k: int = 65) -> np.ndarray:
    """[k, 10] int8 columns at the pair budget's edges: (127, 1), (64, 64), (1, 127) and their negatives,
    mixed signs up to (127, -127) (opposite signs cancel: 255 x 127 at most), and [1, 127, 127, 1, ...],
    whose rows (2j + 1, 2j + 2) sum to 254: exact only on a kernel that pairs rows (2j, 2j + 1). An odd
    k leaves a last row to pair with the kernel's padding."""
    patterns = [
        (127, 1),
        (64, 64),
        (1, 127),
        (-127, -1),
        (-64, -64),
        (127, -1),
        (-1, 127),
        (127, -127),
        (-127, 127),
    ]
    columns = [np.resize(pattern, k) for pattern in patterns] + [np.resize([1, 127, 127, 1], k)]
    return np.stack(columns, axis=1).astype(np.int8)


def worst_codes(k: int = 65, m: int = 64) -> np.ndarray:
    """All-255, all-0 and alternating activation codes (the kernel multiplies raw codes: 128 is the
    zero point), then random ones."""
    rows = [np.full(k, 255), np.zeros(k), np.resize([255, 0], k), np.resize([0, 255], k)]
    rng = np.random.default_rng(0)
    return np.concatenate([np.stack(rows), rng.integers(0, 256, (m - 4, k))]).astype(np.uint8)


def exact_product(codes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return (codes.astype(np.int64) - 128) @ weights.astype(np.int64)


def test_the_pairwise_kernel_saturates_beyond_the_budget():
    """All-255 activations: a pair of 127s (8-bit weights) overflows 16 bits, so do pairs summing to
    129; and a kernel pairing rows otherwise would overflow on the budget's own weights. The checks
    the budget must pass can fail."""
    codes = worst_codes()
    for pattern in ([127, 127], [65, 64], [-1, -128]):
        weights = np.resize(pattern, (65, 2)).astype(np.int8)
        assert (pairwise_16_bit(codes, weights) != exact_product(codes, weights)).any()
    weights = budget_weights()
    assert (pairwise_16_bit(codes, weights, offset=1) != exact_product(codes, weights)).any()


def test_pair_budget_weights_are_exact_on_the_pairwise_kernel():
    """int8-rowwise-avx2's worst cases: every activation code 0 or 255 against weights at every edge
    of the budget (255 x 128 = 32,640 <= 32,767), odd K; and the quantizer never leaves the budget
    while a lone large weight, and a pair of opposite signs, keep nearly 8 bits."""
    from export.int8_precision import PAIR_BUDGET, pair_peak
    from export.quantize_rowwise import quantize_weight

    assert PAIR_BUDGET == 128 and 255 * 128 <= 32767 < 255 * 129
    codes, weights = worst_codes(), budget_weights()
    assert pair_peak(weights) == PAIR_BUDGET and pair_peak(np.array([[127], [-127]])) == 127
    np.testing.assert_array_equal(pairwise_16_bit(codes, weights), exact_product(codes, weights))
    rng = np.random.default_rng(1)
    for k in (64, 65):
        w = rng.standard_normal((k, 16)).astype(np.float32)
        w[3, 2], w[20, 5], w[21, 5] = 40.0, 9.0, 9.0  # one outlier; a same-signed pair of them
        w[30:32, 7] = 12.0, -12.0  # an opposite-signed pair: 8-bit codes, the column's scale unchanged
        q, scales = quantize_weight(w, PAIR_BUDGET)
        assert pair_peak(q) <= PAIR_BUDGET and np.abs(q.astype(int)).max() > 120  # beyond 7 bits
        assert list(q[30:32, 7]) == [127, -127] and np.abs(q[:, 5].astype(int)).max() <= 64
        assert np.abs(q * scales - w).max() <= scales.max()  # within a step: nothing clipped
        codes = worst_codes(k)
        np.testing.assert_array_equal(pairwise_16_bit(codes, q), exact_product(codes, q))


@pytest.mark.parametrize(
    "pair, peak, refused", [((127, -127), 127, False), ((64, 64), 128, False), ((65, 64), 129, True)]
)
def test_export_refuses_an_avx2_graph_whose_same_signed_pairs_leave_the_budget(tmp_path, pair, peak, refused):
    """`require_pair_safe` reads the graph's int8 weights: opposite signs may reach 127 each, a
    same-signed pair past 128 is refused for int8-rowwise-avx2 (and only recorded for int8-rowwise)."""
    pytest.importorskip("onnx")
    from export.int8_precision import require_pair_safe

    path = tmp_path / "model.onnx"
    path.write_bytes(matmul_model(np.resize(pair, (7, 3)).astype(np.int8)))
    assert require_pair_safe("int8-rowwise", path) == peak
    if refused:
        with pytest.raises(ValueError, match=f"holds {peak}"):
            require_pair_safe("int8-rowwise-avx2", path)
    else:
        assert require_pair_safe("int8-rowwise-avx2", path) == peak


def test_the_avx2_variant_is_served_without_the_widening_kernel(monkeypatch):
    """On an AVX2-only CPU (injected flags) the service opens int8-rowwise-avx2 on the fast kernel and
    int8-rowwise on the exact widening one; the worst case adds up exactly on the former with this
    CPU's real kernel (the fast non-VNNI one where the suite runs on such a CPU)."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from app.engine.runtime import session_options
    from export import int8_precision

    monkeypatch.setattr(int8_precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda cpuinfo=None: set(AVX2_ONLY))
    assert config_entry(session_options(1, variant="int8-rowwise"), X64_QUANT_PRECISION) == "1"
    options = session_options(1, variant="int8-rowwise-avx2")
    assert config_entry(options, X64_QUANT_PRECISION) is None
    codes, weights = worst_codes(), budget_weights()
    served = ort.InferenceSession(matmul_model(weights), options, providers=["CPUExecutionProvider"])
    for rows in (codes[:1], codes):  # one row takes MLAS's GEMV kernel, more its GEMM kernel
        np.testing.assert_array_equal(served.run(None, {"codes": rows})[0], exact_product(rows, weights))


AVX2_SCRIPT = """
import numpy as np
import onnxruntime as ort
from tests.export.test_int8_precision import budget_weights, exact_product, matmul_model, worst_codes

for name, k in (("8bit", 65), ("budget", 65), ("budget", 385)):
    codes = worst_codes(k)
    weights = np.full((k, 8), 127, np.int8) if name == "8bit" else budget_weights(k)
    session = ort.InferenceSession(matmul_model(weights), providers=["CPUExecutionProvider"])
    for rows in (codes[:1], codes):
        error = np.abs(session.run(None, {"codes": rows})[0] - exact_product(rows, weights)).max()
        print(name, k, len(rows), int(error))
"""


def assert_the_avx2_kernel(result) -> None:
    """AVX2_SCRIPT's output: 8-bit weights wrong (so the saturating AVX2 path ran), the pair budget exact."""
    assert result.returncode == 0, result.stderr[-2000:]
    errors = {
        tuple(line.split()[:3]): int(line.split()[3]) for line in result.stdout.splitlines() if line.strip()
    }
    assert len(errors) == 6, result.stdout
    assert errors[("8bit", "65", "1")] > 0 and errors[("8bit", "65", "64")] > 0, (
        "not the saturating AVX2 path"
    )
    assert all(error == 0 for (name, *_), error in errors.items() if name == "budget"), errors


def test_the_real_avx2_kernel_under_emulation():
    """onnxruntime's own AVX2 u8 x s8 kernels, on this machine: qemu-user emulates a Haswell CPU (AVX2,
    no VNNI), so MLAS dispatches to its non-VNNI GEMV (one row) and GEMM kernels. 8-bit weights must
    come out wrong there (proof that the emulated path is the saturating one), pair-budget weights
    exact, including the pattern a differently pairing kernel would break, over K blocks. Not for timing."""
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
        [qemu, "-cpu", "Haswell", sys.executable, "-c", AVX2_SCRIPT],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert_the_avx2_kernel(result)
