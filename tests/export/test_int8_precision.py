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
