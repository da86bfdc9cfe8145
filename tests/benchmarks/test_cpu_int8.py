"""cpu_int8: candidates are checked against fp32 before they are timed, the static QDQ candidate is
batch-invariant, and the report renders, on a tiny bundle."""

from __future__ import annotations

import numpy as np

from benchmarks import cpu_candidates, cpu_int8, scaling
from export.bundle import load_bundle_manifest
from export.invariance import batch_invariance
from export.verify import run_session, verification_cases

VOCAB = 100  # the tiny vocabulary has more tokens; stay inside it


def tiny_candidates(bundle):
    manifest = load_bundle_manifest(bundle)
    return [
        cpu_candidates.Candidate(
            v, bundle / manifest.variants[v].file, manifest.variants[v].disabled_optimizers
        )
        for v in cpu_candidates.BUNDLE_VARIANTS
    ]


def test_static_qdq_candidate_is_batch_invariant(tiny_bundles, tmp_path):
    bundle = tiny_bundles["classify"]
    calibration = [scaling.feeds(1, n, VOCAB, seed=n) for n in (5, 9, 17)]
    out = tmp_path / "qdq.onnx"
    report = cpu_candidates.quantize_static_qdq(bundle / "model.onnx", out, calibration)
    assert report["calibration_sentences"] == 3 and out.exists()
    session = cpu_candidates.Candidate("qdq", out).session(1)
    case = [c for c in verification_cases("classify", VOCAB, 32) if c.name == "batch5_seq7"][0]
    inv = batch_invariance("classify", lambda feeds: run_session(session, feeds), [case.feeds])
    assert inv["invariant"], inv


def test_a_candidate_that_disagrees_with_fp32_is_not_timed(tiny_bundles):
    cands = tiny_candidates(tiny_bundles["classify"])
    feeds = scaling.feeds(8, 16, VOCAB)
    logits = run_session(cands[0].session(1), feeds)["logits"]
    reference = {"feeds": feeds, "logits": logits}
    rows = cpu_int8.latency(cands, [(1, 16)], (1,), runs=3, budget_s=0.1, reference=reference, vocab=VOCAB)
    assert {r["candidate"] for r in rows} == {"fused", "int8", "int8-rowwise"}
    assert all(r["median_ms"] > 0 and r["runs"] >= 3 for r in rows)
    wrong = {"feeds": feeds, "logits": -logits}  # as if a provider computed something else
    rows = cpu_int8.latency(cands[:1], [(1, 16)], (1,), runs=3, budget_s=0.1, reference=wrong, vocab=VOCAB)
    assert rows == [{"candidate": "fused", "threads": 1, "error": rows[0]["error"]}]
    assert "decisions" in rows[0]["error"]


def test_profile_and_report(tiny_bundles, tmp_path):
    cands = tiny_candidates(tiny_bundles["classify"])
    prof = cpu_int8.profile(cands[2], 1, 16, runs=3, vocab=VOCAB)
    assert "MatMulIntegerToFloat" in prof["by_op"] and "MultiHeadAttention" in prof["by_op"]
    assert np.isclose(sum(r["share"] for r in prof["by_op"].values()), 1.0, atol=1e-3)
    prof["floor"] = {"fp32_ms": 1.0, "int8_ms": 0.5}
    report = {
        "created_at": "now",
        "machine": {"cpu": "test", "logical_cores": 2, "memory_gb": 1},
        "load_average": {"start": [1, 1, 1], "end": [1, 1, 1]},
        "settings": {"command": "python -m benchmarks.cpu_int8 --quick"},
        "notes": {},
        "latency": [
            {"candidate": "int8", "threads": 1, "batch": 1, "seq": 16, "median_ms": 2.0, "runs": 3},
            {"candidate": "int8-rowwise", "threads": 1, "batch": 1, "seq": 16, "median_ms": 2.2, "runs": 3},
            {
                "candidate": "int8",
                "threads": 1,
                "batch": 1,
                "seq": 128,
                "median_ms": 4.0,
                "cpu_median_ms": 3.5,
            },
            {"candidate": "int8-rowwise", "threads": 1, "batch": 1, "seq": 128, "median_ms": 4.4, "runs": 3},
            {
                "candidate": "int8",
                "threads": 1,
                "batch": 32,
                "seq": 128,
                "median_ms": 100.0,
                "cpu_median_ms": 99,
            },
            {
                "candidate": "int8-rowwise",
                "threads": 1,
                "batch": 32,
                "seq": 128,
                "median_ms": 104.0,
                "runs": 3,
            },
            {"candidate": "int8", "threads": 2, "batch": 1, "seq": 128, "median_ms": 2.4, "runs": 3},
            {"candidate": "int8-rowwise", "threads": 2, "batch": 1, "seq": 128, "median_ms": 2.6, "runs": 3},
        ],
        "invariance_and_accuracy": {"skipped": "no data"},
        "peaks": {t: {"peak_gflops": {"fp32": 10.0 * n, "int8": 40.0 * n}} for t, n in (("1", 1), ("2", 2))},
        "profile": prof,
    }
    report["targets"] = cpu_int8.targets(
        report, "int8-rowwise", {"hidden": 32, "layers": 2, "intermediate": 64}
    )
    one, two = report["targets"]
    assert (one["threads"], one["chosen_ms"], one["met"]) == (1, 4.4, True)  # ≤ 4.5 ms
    assert (two["threads"], two["chosen_ms"], two["met"], two["fastest"]) == (2, 2.6, False, "int8")  # > 2.5
    assert two["matmul_floor_ms"] < one["matmul_floor_ms"]
    assert 0 < one["other_ops_share"] < 1 and abs(one["other_ops_ms"] - 4.4 * one["other_ops_share"]) < 0.01
    report["latency"][3]["cpu_median_ms"], report["latency"][5]["cpu_median_ms"] = 3.85, 101.97
    report["ratio_targets"] = cpu_int8.ratio_targets(report)
    one, batched, two = report["ratio_targets"]  # (1,128) and (32,128) at one thread, (1,128) at two
    assert (one["ratio"], one["cpu_ratio"], one["met"]) == (1.1, 1.1, False)
    assert (batched["shape"], batched["ratio"], batched["cpu_ratio"], batched["met"]) == (
        [32, 128],
        1.04,
        1.03,
        True,
    )
    assert two["threads"] == 2 and "cpu_ratio" not in two
    report["profiles"] = {"int8 (1,16)": prof, "int8-rowwise (1,16)": prof}
    text = cpu_int8.markdown(report)
    assert "| 1 | (32,128) | 100.00 | 104.00 | 1.040× | 1.03 | yes |" in text
    report["latency"][3]["median_ms"] = 4.0  # the wall clock says 1.0x, CPU time still 1.1x: not met
    assert [t["met"] for t in cpu_int8.ratio_targets(report)] == [False, True, False]
    assert "| int8-rowwise | — | 3.85 (1.10×) | 101.97 (1.03×) |" in text  # one thread's CPU time
    assert "| MatMulIntegerToFloat | " in text.split("## Side by side")[1]
    assert "| int8-rowwise | 1 | 2.20 (1.10×) |" in text and "MatMulIntegerToFloat" in text
    assert "| 2 | ≤ 2.5 ms | int8-rowwise 2.6 | int8 2.4 |" in text
    cpu_int8.plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_openvino_worker_reports_a_fallback_instead_of_timing_it(tiny_bundles, tmp_path):
    # This venv's onnxruntime has no OpenVINO EP: the session silently runs on the CPU EP, which
    # the worker must catch (as it would a bad provider path) rather than time as "OpenVINO".
    import sys
    from types import SimpleNamespace

    bundle = tiny_bundles["classify"]
    feeds = scaling.feeds(4, 8, VOCAB)
    reference = {
        "feeds": feeds,
        "logits": run_session(tiny_candidates(bundle)[0].session(1), feeds)["logits"],
    }
    args = SimpleNamespace(shapes=[(1, 8)], runs=2, budget_s=0.1)
    out = cpu_candidates.openvino(sys.executable, bundle / "model.onnx", None, reference, tmp_path, args)
    assert [r["candidate"] for r in out["rows"]] == ["openvino-fp32"] * 2 + ["openvino-bf16-hint"] * 2
    assert all("fell back" in r["error"] and "1x8_ms" not in r for r in out["rows"])


def test_rowwise_stages_are_timed_one_at_a_time(tiny_bundles, tmp_path):
    from collections import Counter

    import onnx

    cands, notes = cpu_int8.stage_candidates(tiny_bundles["classify"], tmp_path)
    names = ["rowwise stages: none", "rowwise stages: blocked", "rowwise stages: gelu_floor"]
    assert [c.name for c in cands] == names
    assert (
        notes["served_stages"] == notes["all_stages"] == ["blocked", "gelu_floor"] and "warning" not in notes
    )
    ops = {c.name: Counter(n.op_type for n in onnx.load(c.path).graph.node) for c in cands}
    assert ops[names[0]]["Div"] and ops[names[0]]["ReduceMin"]  # the first rewrite
    assert not ops[names[1]]["Div"] and ops[names[1]]["ReduceMin"]
    assert ops[names[2]]["Div"] and not ops[names[2]]["ReduceMin"]
    case = [c for c in verification_cases("classify", VOCAB, 32) if c.name == "batch5_seq7"][0]
    for c in cands:
        session = c.session(1)
        inv = batch_invariance("classify", lambda feeds, s=session: run_session(s, feeds), [case.feeds])
        assert inv["invariant"], (c.name, inv)
