"""export.defaults: cached bundles are reused only while their sources are unchanged."""

from __future__ import annotations

from export import defaults


def test_fingerprint_follows_sources_and_variants(tmp_path):
    compact = tmp_path / "compact"
    compact.mkdir()
    (compact / "delta.safetensors").write_bytes(b"abc")
    first = defaults.fingerprint(compact, ["fp32", "int8"])
    assert defaults.fingerprint(compact, ["int8", "fp32"]) == first
    assert defaults.fingerprint(compact, ["fp32"]) != first
    (compact / "delta.safetensors").write_bytes(b"abd")
    assert defaults.fingerprint(compact, ["fp32", "int8"]) != first


def test_fingerprint_follows_only_its_own_int8_measurement(tmp_path, monkeypatch):
    import json

    results = tmp_path / "int8_task_data.json"
    monkeypatch.setattr(defaults, "TASK_DATA", results)
    compact = tmp_path / "sst2-minilm"
    compact.mkdir()
    (compact / "delta.safetensors").write_bytes(b"abc")
    results.write_text(json.dumps({"sst2-minilm": {"int8_cost": 0.1}, "other": {"int8_cost": 1}}))
    first = defaults.fingerprint(compact, ["int8"])
    results.write_text(json.dumps({"sst2-minilm": {"int8_cost": 0.1}, "other": {"int8_cost": 2}}))
    assert defaults.fingerprint(compact, ["int8"]) == first  # another bundle's line changed
    results.write_text(json.dumps({"sst2-minilm": {"int8_cost": 0.2}}))
    assert defaults.fingerprint(compact, ["int8"]) != first
    # A default built from the base package is named by its index entry, not by its source folder.
    base = defaults.fingerprint(compact, ["int8"], name="other")
    results.write_text(json.dumps({"sst2-minilm": {"int8_cost": 0.2}, "other": {"int8_cost": 3}}))
    assert defaults.fingerprint(compact, ["int8"], name="other") != base


def test_bundle_is_current_only_with_matching_stamp(tmp_path):
    bundle = tmp_path / "b"
    bundle.mkdir()
    assert not defaults.is_current(bundle, "x")
    (bundle / "bundle.json").write_text("{}")
    (bundle / defaults.STAMP).write_text("x\n")
    assert defaults.is_current(bundle, "x")
    assert not defaults.is_current(bundle, "y")


def test_committed_defaults_cover_every_task_within_budget():
    import json

    from processing.tasks import TASK_NAMES

    index = json.loads((defaults.DEFAULTS_DIR / defaults.INDEX).read_text())
    tasks = {spec["task"] for spec in index["models"].values()}
    # No SPLADE weights can be had offline: /embed_sparse serves a model its user exports (--task sparse).
    assert tasks == set(TASK_NAMES) - {"sparse"}
    compact = [name for name, spec in index["models"].items() if spec.get("from") != "base"]
    # The sentence encoder is the base package itself: nothing of it is committed.
    assert [name for name in index["models"] if name not in compact] == ["all-minilm-l6-v2"]
    assert not (defaults.DEFAULTS_DIR / "all-minilm-l6-v2").exists()
    total = sum(p.stat().st_size for name in compact for p in (defaults.DEFAULTS_DIR / name).iterdir())
    assert total <= 25_000_000, f"compact defaults take {total / 1e6:.1f} MB"


def test_the_build_reads_no_benchmark_results():
    # The product's manifests must not depend on what a benchmark run left in benchmarks/results.
    assert defaults.TASK_DATA.parent == defaults.DEFAULTS_DIR
    source = (defaults.REPO / "export" / "defaults.py").read_text(encoding="utf-8")
    assert "results" not in source and "int8_accuracy.json" not in source
    import json

    recorded = json.loads(defaults.TASK_DATA.read_text(encoding="utf-8"))
    index = json.loads((defaults.DEFAULTS_DIR / defaults.INDEX).read_text(encoding="utf-8"))
    assert set(recorded) == set(index["models"])
    assert "/work/" not in defaults.TASK_DATA.read_text(encoding="utf-8")


def test_fingerprint_follows_the_calibration_text(tmp_path, monkeypatch):
    from export import calibration

    text = tmp_path / "calibration.txt"
    monkeypatch.setattr(calibration, "CALIBRATION_TEXT", text)
    compact = tmp_path / "compact"
    compact.mkdir()
    text.write_text("one line of prose\n")
    first = defaults.fingerprint(compact, ["int8-rowwise-avx2"])
    text.write_text("another line of prose\n")
    assert defaults.fingerprint(compact, ["int8-rowwise-avx2"]) != first


def test_fingerprint_follows_the_index_entry(tmp_path):
    """A changed defaults.json entry (max_seq_len, avx2_rounding, ...) rebuilds its bundle."""
    compact = tmp_path / "compact"
    compact.mkdir()
    spec = {"task": "classify", "max_seq_len": 128}
    first = defaults.fingerprint(compact, ["int8"], spec=spec)
    assert defaults.fingerprint(compact, ["int8"], spec=dict(reversed(spec.items()))) == first
    assert defaults.fingerprint(compact, ["int8"], spec={**spec, "avx2_rounding": "nearest"}) != first
