"""qa_vs_pipeline: its data helpers checked exactly (held-out article selection, long contexts, answer
agreement), and end to end on a tiny model and a tiny SQuAD file; the skip path without data."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from benchmarks import qa_vs_pipeline
from benchmarks.qa_vs_pipeline import agreement, build_long_context, select_articles

from .conftest import write_squad


def test_writes_well_formed_results(tiny_checkpoints, tiny_bundles, tmp_path):
    data = write_squad(tmp_path / "squad.json", articles=3)
    out = tmp_path / "results"
    code = qa_vs_pipeline.main([
        "--quick", "--data", str(data), "--articles", "all", "--bundle", str(tiny_bundles["qa"]),
        "--checkpoint", str(tiny_checkpoints["qa"]), "--variants", "fp32,int8", "--sizes", "200,800",
        "--latency-questions", "2", "--repeats", "1", "--threads", "1", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    report = json.loads((out / "qa_vs_pipeline_quick.json").read_text())
    assert report["questions"] == 6
    assert set(report["scores"]) == {"ours-fp32", "ours-int8", "transformers"}
    for scores in report["scores"].values():
        assert 0.0 <= scores["exact_match"] <= scores["f1"] <= 100.0
    fp32 = report["agreement"]["ours-fp32"]
    assert fp32["questions"] == 6 and 0 <= fp32["same_span"] <= fp32["same_normalized_text"] <= 6
    latency = report["latency"]
    assert len(latency["rows"]) == 3 * 2 * 2  # readers x sizes x questions
    assert {r["target_chars"] for r in latency["rows"]} == {200, 800}
    assert all(r["chars"] == r["target_chars"] and r["ms"] > 0 for r in latency["rows"])
    for fit in latency["fits"].values():
        assert fit["ms_per_1k_chars"] is not None and fit["loglog_exponent"] is not None
        assert set(fit["mean_ms_by_size"]) == {"200", "800"}
    assert report["machine"]["cpu"] and report["machine"]["versions"]["onnxruntime"]
    assert report["settings"]["articles"].startswith("all: 3 of 3 articles")
    assert (out / "qa_vs_pipeline_quick.png").stat().st_size > 1000
    assert "ours-fp32" in (out / "qa_vs_pipeline_quick.md").read_text()


def test_skips_cleanly_without_data(tmp_path, capsys):
    code = qa_vs_pipeline.main(["--data", str(tmp_path / "missing.json"), "--out", str(tmp_path / "out")])
    assert code == 0
    assert "skipping" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def examples(counts: list[int]) -> list[SimpleNamespace]:
    """Questions grouped by article: article i has counts[i] questions."""
    return [SimpleNamespace(id=f"{a}-{q}", group=f"art{a}") for a, n in enumerate(counts) for q in range(n)]


def groups(chosen) -> list[str]:
    return list(dict.fromkeys(e.group for e in chosen))


def test_trainer_split_is_the_training_code_s_validation_split():
    from train.splits import split_by_group

    data = examples([5, 1, 7, 2, 9, 4, 3, 6])
    chosen, _ = select_articles(data, "trainer:0.25:7")
    assert [e.id for e in chosen] == [e.id for e in split_by_group(data, 0.25, 7)[1]]
    assert 0 < len(groups(chosen)) < 8


def test_all_and_bad_names():
    data = examples([1, 2, 3])
    chosen, described = select_articles(data, "all")
    assert len(chosen) == 6 and "3 of 3" in described
    with pytest.raises(SystemExit, match="neither"):
        select_articles(data, "last:0.15")


@pytest.mark.parametrize("target", [50, 333, 5000])
def test_long_context_has_the_target_length_and_holds_the_paragraph(target):
    paragraph = "john smith lives in paris."
    fillers = [f"filler paragraph number {i} about nothing in particular." for i in range(7)] + [paragraph]
    context, offset = build_long_context(paragraph, fillers, target, random.Random(target))
    assert len(context) == target
    assert context[offset : offset + len(paragraph)] == paragraph
    assert context.count(paragraph) == 1  # the paragraph itself is never used as filler


def test_long_context_shorter_than_the_paragraph_is_the_paragraph():
    assert build_long_context("a long paragraph", ["x"], 5, random.Random(0)) == ("a long paragraph", 0)
    with pytest.raises(ValueError, match="other paragraphs"):
        build_long_context("p", ["p"], 100, random.Random(0))


def test_agreement_counts_spans_texts_and_overlap():
    ours = {
        "a": {"text": "Paris", "start": 10, "end": 15},
        "b": {"text": "the Seine", "start": 0, "end": 9},
        "c": {"text": "in 1998", "start": 3, "end": 10},
        "d": {"text": "red car", "start": 4, "end": 11},
    }
    theirs = {
        "a": {"text": "Paris", "start": 10, "end": 15},  # same span
        "b": {"text": "Seine", "start": 30, "end": 35},  # same normalised text, other span
        "c": {"text": "1998", "start": 6, "end": 10},  # partial overlap: F1 2/3
        "d": {"text": "blue bike", "start": 0, "end": 9},  # nothing in common
    }
    result = agreement(ours, theirs)
    assert (result["questions"], result["same_span"], result["same_normalized_text"]) == (4, 1, 2)
    assert result["same_span_rate"] == 0.25 and result["same_text_rate"] == 0.5
    assert result["mean_token_f1_between"] == pytest.approx((1 + 1 + 2 / 3 + 0) / 4, abs=1e-4)
    assert [d["id"] for d in result["examples_of_differences"]] == ["c", "d"]
    with pytest.raises(ValueError, match="differ"):
        agreement(ours, {"a": theirs["a"]})
