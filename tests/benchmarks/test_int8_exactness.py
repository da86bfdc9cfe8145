"""benchmarks.int8_exactness: the uint8-weight encoding is exact on any CPU; the report names the CPU's
int8 dot-product instructions."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")


def test_uint8_weights_add_up_exactly_and_the_report_is_written(tmp_path):
    from benchmarks.int8_exactness import measure, write

    encodings = measure(k=64, n=16, rows=8, repeats=2)
    exact = encodings["u8 x u8 (weights + 128)"]["max_abs_error"]
    assert set(exact) == {"random codes", "codes 255", "codes near the zero point (118..138)"}
    assert all(error == 0 for error in exact.values()), exact
    result = {
        "command": "python -m benchmarks.int8_exactness",
        "machine": {"cpu": "test cpu"},
        "int8_dot_flags": [],
        "k": 64,
        "n": 16,
        "rows": 8,
        "encodings": encodings,
    }
    write(result, tmp_path)
    table = (tmp_path / "int8_exactness.md").read_text()
    assert "none (AVX2 only)" in table
    assert "| u8 x s8 (int8-rowwise) |" in table and "| u8 x u8 (weights + 128) | 0 | 0 | 0 |" in table
