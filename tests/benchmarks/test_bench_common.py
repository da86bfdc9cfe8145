"""bench_common: which checkpoint the baseline loads, line fits, bundle checks."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from benchmarks import bench_common


def test_auto_checkpoint_is_the_bundle_source(tiny_checkpoints, tiny_bundles):
    path, how = bench_common.resolve_checkpoint(tiny_bundles["qa"], "auto", "qa")
    assert path.resolve() == tiny_checkpoints["qa"].resolve() and how == "bundle source checkpoint"


def test_given_checkpoint_must_be_a_checkpoint(tiny_bundles, tiny_checkpoints, tmp_path):
    assert (
        bench_common.resolve_checkpoint(tiny_bundles["qa"], str(tiny_checkpoints["qa"]), "qa")[1] == "given"
    )
    with pytest.raises(SystemExit, match="no config.json"):
        bench_common.resolve_checkpoint(tiny_bundles["qa"], str(tmp_path), "qa")


def orphan_bundle(tiny_bundles, tmp_path, name: str):
    """A copy of the tiny QA bundle named `name` whose source checkpoint is gone."""
    bundle = shutil.copytree(tiny_bundles["qa"], tmp_path / "bundle")
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["name"] = name
    manifest["model"]["source_checkpoint"] = str(tmp_path / "gone")
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    return bundle


def test_missing_source_without_fallback_says_what_to_pass(tiny_bundles, tmp_path, monkeypatch):
    bundle = orphan_bundle(tiny_bundles, tmp_path, "no-such-default")
    monkeypatch.setattr(bench_common, "default_checkpoint", lambda task: tmp_path / "runs" / task / "best")
    with pytest.raises(SystemExit, match="pass the checkpoint directory explicitly"):
        bench_common.resolve_checkpoint(bundle, None, "qa", work=tmp_path / "work")


def test_require_bundle_checks_presence_and_task(tiny_bundles, tmp_path):
    assert bench_common.require_bundle(tiny_bundles["qa"], "qa") == tiny_bundles["qa"]
    with pytest.raises(SystemExit, match="export.defaults"):
        bench_common.require_bundle(tmp_path, "qa")
    with pytest.raises(SystemExit, match="expected 'classify'"):
        bench_common.require_bundle(tiny_bundles["qa"], "classify")


def test_linear_fit_and_power_law():
    fit = bench_common.linear_fit([1, 2, 3, 4], [5, 7, 9, 11])
    assert fit["slope"] == pytest.approx(2) and fit["intercept"] == pytest.approx(3) and fit["r2"] == 1.0
    assert bench_common.power_law_exponent([10, 100, 1000], [3, 300, 30000]) == pytest.approx(2)
    assert bench_common.power_law_exponent([10, 100, 1000], [7, 70, 700]) == pytest.approx(1)
    with pytest.raises(ValueError):
        bench_common.linear_fit([1, 1], [2, 3])


def test_rebuilt_baseline_follows_a_retrained_default(tiny_bundles, tmp_path, monkeypatch):
    import model.compact

    bundle = orphan_bundle(tiny_bundles, tmp_path, "tiny-default")
    compact = tmp_path / "defaults" / "tiny-default"
    compact.mkdir(parents=True)
    (compact / "compact.json").write_text("{}")
    (compact / "delta.safetensors").write_bytes(b"v1")
    builds = []

    def fake_rebuild(source, out):
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        builds.append((source / "delta.safetensors").read_bytes())

    monkeypatch.setattr(bench_common, "ROOT", tmp_path)
    monkeypatch.setattr(model.compact, "rebuild", fake_rebuild)
    for _ in range(2):
        path, how = bench_common.resolve_checkpoint(bundle, None, "qa", work=tmp_path / "work")
    assert builds == [b"v1"] and "rebuilt" in how and (path / "config.json").is_file()
    (compact / "delta.safetensors").write_bytes(b"v2")  # retrained
    bench_common.resolve_checkpoint(bundle, None, "qa", work=tmp_path / "work")
    assert builds == [b"v1", b"v2"]


def test_results_are_written_relative_to_the_repository(tmp_path):
    import sys

    root = bench_common.ROOT
    report = {
        "command": [sys.executable, "-m", "uvicorn"],
        "bundle": str(root / ".cache" / "bundles" / "sst2-minilm"),
        "data": str(root.parent / "shared" / "data" / "sst2" / "train.tsv"),
    }
    json_path, md_path = bench_common.write_results(
        tmp_path, "x", report, f"ran `{sys.executable}` in {root}", None
    )
    written = json.loads(json_path.read_text())
    assert written == {
        "command": ["python", "-m", "uvicorn"],
        "bundle": ".cache/bundles/sst2-minilm",
        "data": "../shared/data/sst2/train.tsv",
    }
    assert md_path.read_text() == "ran `python` in .\n"


def test_committed_results_hold_no_machine_paths():
    offenders = [
        path.name
        for path in sorted((bench_common.RESULTS).glob("*"))
        if path.suffix in (".json", ".md") and "/work/" in path.read_text(encoding="utf-8")
    ]
    assert not offenders


# Still edit sys.path while branch issue20 changes them; drop them from this set after its merge.
PENDING_SYS_PATH: set[str] = set()


def test_benchmarks_are_a_package_without_sys_path_edits():
    scripts = sorted(bench_common.ROOT.joinpath("benchmarks").glob("*.py"))
    assert (bench_common.ROOT / "benchmarks" / "__init__.py") in scripts
    editing = {p.name for p in scripts if "sys.path" in p.read_text(encoding="utf-8")}
    assert editing <= PENDING_SYS_PATH, editing - PENDING_SYS_PATH


def test_machine_records_which_vector_extensions_the_cpu_has(monkeypatch):
    import export.int8_precision as int8_precision

    monkeypatch.setattr(int8_precision, "cpu_flags", lambda: {"fma", "avx2", "avx512f", "avx512_vnni"})
    info = bench_common.machine_info()
    assert info["isa"] == ["avx2", "avx512f", "avx512_vnni"]
    assert "(avx2, avx512f, avx512_vnni)," in bench_common.machine_line(info)
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda: {"fma", "avx2"})
    assert "(avx2)," in bench_common.machine_line(bench_common.machine_info())
    # Results written before the flags were recorded: the CPU's name alone. The name is set here,
    # since real names hold parentheses of their own ("Intel(R) Xeon(R)").
    info.update(cpu="Intel(R) Xeon(R) Processor")
    del info["isa"]
    assert bench_common.cpu_label(info) == "Intel(R) Xeon(R) Processor"
    assert bench_common.machine_line(info).startswith("Intel(R) Xeon(R) Processor, ")


def test_timed_stops_at_runs_or_after_the_budget():
    calls = []
    result, times = bench_common.timed(lambda: calls.append(1) or len(calls), runs=5)
    assert result == 5 and len(times) == 5 == len(calls)
    _, slow = bench_common.timed(lambda: time.sleep(0.02), runs=100, budget_s=0.05, min_runs=2)
    assert 2 <= len(slow) < 100 and min(slow) >= 0.02
