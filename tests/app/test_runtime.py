"""Device / variant / thread selection and the CUDA paths, with fake sessions (no GPU here)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from app.engine.runtime import (
    CPU_EP,
    CUDA_EP,
    OrtRuntime,
    RuntimeConfigError,
    choose_variant,
    create_runtime,
    providers_for,
    resolve_device,
    session_threads,
)

ALL_VARIANTS = {"fp32": 1, "fused": 1, "int8": 1, "int8-rowwise": 1, "fp16": 1}


def test_resolve_device():
    assert resolve_device("cpu", [CUDA_EP, CPU_EP]) == "cpu"
    assert resolve_device("auto", [CUDA_EP, CPU_EP]) == "cuda"
    assert resolve_device("auto", [CPU_EP]) == "cpu"
    assert resolve_device("cuda", [CUDA_EP, CPU_EP]) == "cuda"
    with pytest.raises(RuntimeConfigError, match="onnxruntime-gpu"):
        resolve_device("cuda", [CPU_EP])
    with pytest.raises(RuntimeConfigError):
        resolve_device("tpu", [CPU_EP])


VNNI = {"avx2", "avx512f", "avx512bw", "avx512_vnni"}
AVX2_ONLY = {"avx", "avx2", "fma"}


def test_choose_variant():
    assert choose_variant("cuda", ALL_VARIANTS) == "fp16"
    assert choose_variant("cpu", ALL_VARIANTS, flags=VNNI) == "int8-rowwise"  # batch-invariant by default
    assert choose_variant("cpu", ALL_VARIANTS, cpu_variant="int8", flags=VNNI) == "int8"  # the opt-in
    assert choose_variant("cpu", ALL_VARIANTS, cpu_variant="fused") == "fused"
    assert choose_variant("cpu", ALL_VARIANTS, cpu_variant="fp32") == "fp32"
    # Missing preferred variants fall back in a fixed order (and log a warning).
    assert choose_variant("cuda", {"fp32": 1, "int8": 1}) == "fp32"
    assert choose_variant("cpu", {"fp32": 1, "fused": 1}) == "fused"
    assert choose_variant("cpu", {"fp32": 1, "int8": 1}) == "int8"  # a bundle from before int8-rowwise
    with pytest.raises(RuntimeConfigError, match="none of"):
        choose_variant("cuda", {"int8": 1})  # int8 (MatMulInteger) is a CPU-only variant


@pytest.mark.parametrize(
    ("machine", "flags", "served"),
    [
        ("x86_64", VNNI, "int8-rowwise"),  # 32-bit dot products: 8-bit weights are exact and fast
        ("x86_64", {"avx2", "avx_vnni"}, "int8-rowwise"),
        ("x86_64", {"avx2", "amx_int8"}, "int8-rowwise"),
        ("x86_64", AVX2_ONLY, "int8-rowwise-avx2"),  # 16-bit pair sums: pair-budget weights
        ("x86_64", {"avx2", "avx512f", "avx512bw"}, "int8-rowwise-avx2"),  # AVX-512 without VNNI
        ("aarch64", {"asimd"}, "int8-rowwise"),
    ],
)
def test_auto_serves_the_fastest_exact_variant_for_the_cpu(monkeypatch, machine, flags, served):
    """CPU_VARIANT=auto (the default) by the CPU's flags, injected: both branches on any CPU."""
    from app.engine.runtime import variant_choice
    from export import int8_precision

    monkeypatch.setattr(int8_precision.platform, "machine", lambda: machine)
    variants = {**ALL_VARIANTS, "int8-rowwise-avx2": 1}
    variant, reason = variant_choice("cpu", variants, "auto", flags)
    assert variant == served and ("16 bits" in reason) == (served == "int8-rowwise-avx2")
    # CPU_VARIANT still overrides the rule, and says so.
    assert variant_choice("cpu", variants, "int8-rowwise", flags) == (
        "int8-rowwise",
        "CPU_VARIANT=int8-rowwise",
    )
    # A bundle built before the -avx2 variant: the exact 8-bit one, and /models says why.
    old = {v: 1 for v in ALL_VARIANTS}
    variant, reason = variant_choice("cpu", old, "auto", flags)
    assert variant == "int8-rowwise" and ("lacks" in reason) == (served == "int8-rowwise-avx2")


def test_session_threads_never_oversubscribe():
    assert session_threads(0, n_sessions=4, cores=16) == 4
    assert session_threads(0, n_sessions=4, cores=2) == 1
    assert session_threads(0, n_sessions=1, cores=8) == 8
    assert session_threads(3, n_sessions=4, cores=2) == 3  # explicit setting wins


def test_providers():
    assert providers_for("cpu") == [CPU_EP]
    cuda = providers_for("cuda")
    assert cuda[0][0] == CUDA_EP and cuda[-1] == CPU_EP


class FakeSession:
    """Stands in for onnxruntime.InferenceSession; `active` is what get_providers() reports."""

    active: list[str] = [CPU_EP]
    created: list[dict] = []

    def __init__(self, path, sess_options=None, providers=None):
        self.path, self.options, self.requested = path, sess_options, providers
        FakeSession.created.append(
            {"path": path, "providers": providers, "threads": sess_options.intra_op_num_threads}
        )
        self.bound: dict[str, object] = {}
        self.plain_runs = 0

    def get_providers(self):
        return list(self.active)

    def get_inputs(self):
        return [SimpleNamespace(name=n) for n in ("input_ids", "attention_mask", "token_type_ids")]

    def get_outputs(self):
        return [SimpleNamespace(name="logits")]

    def run(self, names, feed):
        self.plain_runs += 1
        return [feed["input_ids"].sum(axis=1, keepdims=True).astype(np.float16)]

    def io_binding(self):
        return FakeBinding(self)

    def run_with_iobinding(self, binding):
        binding.ran = True


class FakeBinding:
    def __init__(self, session):
        self.session, self.inputs, self.outputs, self.ran = session, {}, {}, False

    def bind_cpu_input(self, name, value):
        self.inputs[name] = value

    def bind_output(self, name, device):
        self.outputs[name] = device

    def synchronize_inputs(self):
        pass

    def synchronize_outputs(self):
        pass

    def copy_outputs_to_cpu(self):
        assert self.ran, "outputs copied before run_with_iobinding"
        self.session.bound = {"inputs": dict(self.inputs), "outputs": dict(self.outputs)}
        return [self.inputs["input_ids"].sum(axis=1, keepdims=True).astype(np.float16)]


def batch() -> dict[str, np.ndarray]:
    ids = np.array([[2, 5, 3], [2, 4, 0]], dtype=np.int64)
    return {
        "input_ids": ids,
        "attention_mask": (ids > 0).astype(np.int64),
        "token_type_ids": np.zeros_like(ids),
    }


def test_cuda_refused_when_session_fell_back_to_cpu(monkeypatch):
    monkeypatch.setattr(FakeSession, "active", [CPU_EP])
    with pytest.raises(RuntimeConfigError, match="Refusing to fall back"):
        create_runtime("m.onnx", "cuda", threads=2, session_factory=FakeSession)


def test_cuda_session_uses_io_binding(monkeypatch):
    monkeypatch.setattr(FakeSession, "active", [CUDA_EP, CPU_EP])
    runtime = create_runtime("m.onnx", "cuda", threads=2, session_factory=FakeSession)
    assert runtime.io_binding and runtime.provider == CUDA_EP
    assert FakeSession.created[-1]["providers"][0][0] == CUDA_EP
    out = runtime.run(batch())
    session = runtime.session
    assert session.plain_runs == 0
    assert set(session.bound["inputs"]) == {"input_ids", "attention_mask", "token_type_ids"}
    assert session.bound["outputs"] == {"logits": "cuda"}
    # fp16 model outputs come back as float32 for the post-processing.
    assert out["logits"].dtype == np.float32 and out["logits"][:, 0].tolist() == [10.0, 6.0]


def test_cpu_session_runs_plainly_with_thread_budget(monkeypatch):
    monkeypatch.setattr(FakeSession, "active", [CPU_EP])
    runtime = create_runtime("m.onnx", "cpu", threads=3, session_factory=FakeSession)
    assert not runtime.io_binding
    assert FakeSession.created[-1]["threads"] == 3 and FakeSession.created[-1]["providers"] == [CPU_EP]
    out = runtime.run(batch())
    assert runtime.session.plain_runs == 1 and out["logits"].dtype == np.float32


def test_missing_input_is_an_error():
    runtime = OrtRuntime(FakeSession("m.onnx", SimpleNamespace(intra_op_num_threads=1)), "cpu")
    with pytest.raises(ValueError, match="token_type_ids"):
        runtime.run({"input_ids": np.zeros((1, 2), np.int64), "attention_mask": np.ones((1, 2), np.int64)})


def test_real_session_on_a_bundle(app_bundles):
    """The real onnxruntime path, on the int8 variant of a tiny bundle."""
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(app_bundles["classify"])
    runtime = create_runtime(manifest.variant_path(app_bundles["classify"], "int8"), "cpu", threads=1)
    out = runtime.run(batch())
    assert runtime.provider == CPU_EP and out["logits"].shape == (2, 2)
