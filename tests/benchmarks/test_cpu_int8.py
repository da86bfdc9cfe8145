"""cpu_int8: every rewritten candidate is batch-invariant and close to fp32, the static one carries
its bias inside the matmul, and the report renders, on a tiny bundle."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import cpu_int8
from export.invariance import batch_invariance
from export.verify import run_session, verification_cases

VOCAB = 100  # the tiny vocabulary has more tokens; stay inside it


@pytest.fixture(scope="module")
def built(tiny_bundles, tmp_path_factory):
    cases = verification_cases("classify", VOCAB, 32)
    calibration = [c.feeds for c in cases]
    work = tmp_path_factory.mktemp("cpu-int8")
    return cpu_int8.candidates(tiny_bundles["classify"], work, calibration)[0], cases


def test_candidates_are_batch_invariant_and_close_to_fp32(built):
    cands, cases = built
    assert [c.name for c in cands[:3]] == ["fused", "int8", "int8-rowwise"]
    case = [c for c in cases if c.name == "batch5_seq7"][0]
    reference = run_session(cands[0].session(1), case.feeds)["logits"]
    for c in cands[2:]:
        session = c.session(1)
        inv = batch_invariance("classify", lambda feeds, s=session: run_session(s, feeds), [case.feeds])
        assert inv["invariant"] and inv["max_abs_diff"] == 0, (c.name, inv)
        logits = run_session(session, case.feeds)["logits"]
        assert np.abs(logits - reference).max() < 0.5 * np.abs(reference).max() + 0.05, c.name


def test_static_scales_fold_the_bias_into_the_matmul(built):
    import onnx

    static = [c for c in built[0] if c.name == "static per-tensor"][0]
    graph = onnx.load(str(static.path)).graph
    matmuls = [n for n in graph.node if n.op_type == "MatMulIntegerToFloat"]
    gelu_inputs = {n.input[0] for n in graph.node if n.op_type == "BiasGelu"}  # GELU adds that bias
    biased = [n for n in matmuls if len(n.input) == 7 and n.input[6]]
    assert biased and len(biased) == len([n for n in matmuls if n.output[0] not in gelu_inputs])
    assert not any(n.op_type in ("ReduceMax", "Abs") for n in graph.node)  # no row statistics


def test_report_renders(tmp_path):
    latency = [
        {"candidate": name, "threads": t, "shape": [b, 128], "wall_ms": ms * t, "cpu_ms": ms, "runs": 3}
        for name, ms in (("int8", 10.0), ("int8-rowwise", 11.0), ("static per-tensor", 10.2))
        for t in (1, 2)
        for b in (1, 32)
    ]
    line = {
        "invariance": {"max_abs_diff": 0.0},
        "accuracy_batched": 0.9,
        "accuracy_single": 0.9,
        "logits_vs_fp32": {"max_abs": 0.1, "mean_abs": 0.01, "decisions_agree": 1.0},
    }
    report = {
        "created_at": "now",
        "command": "python -m benchmarks.cpu_int8 --quick",
        "machine": {"cpu": "test", "logical_cores": 2},
        "load_average": {"start": [1, 1, 1], "end": [1, 1, 1]},
        "notes": {},
        "latency": latency,
        "quality": {"examples": 3, "int8-rowwise": line},
        "profiles": {"(1,128)": {"int8": {"DynamicQuantizeMatMul": 5.0}, "int8-rowwise": {"Abs": 1.0}}},
    }
    report["ratios"] = cpu_int8.ratios(report)
    met = {(r["candidate"], r["threads"], r["shape"][0]): r["met"] for r in report["ratios"]}
    assert met[("int8-rowwise", 1, 1)] is False and met[("static per-tensor", 2, 32)] is True
    text = cpu_int8.markdown(report)
    assert "| int8-rowwise | 1 | (1, 128) | 10.00 | 11.00 | 1.100× |" in text
    assert "| Abs | 0 | 1 |" in text
    cpu_int8.plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
