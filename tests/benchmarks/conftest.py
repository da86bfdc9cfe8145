"""Tiny random checkpoints and bundles (made once per session) for the benchmark smoke tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.tiny import make_tiny_checkpoint

MAX_SEQ_LEN = 64


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench-checkpoints")
    return {task: make_tiny_checkpoint(task, root / task) for task in ("classify", "qa", "ner")}


@pytest.fixture(scope="session")
def tiny_bundles(tiny_checkpoints, tmp_path_factory) -> dict[str, Path]:
    from export import export_bundle

    root = tmp_path_factory.mktemp("bench-bundles")
    return {
        task: export_bundle(
            tiny_checkpoints[task],
            root / task,
            variants=("fp32", "fused", "int8", "int8-rowwise"),
            max_seq_len=MAX_SEQ_LEN,
        )
        for task in ("classify", "qa")
    }


def write_squad(path: Path, articles: int = 3) -> Path:
    """A small SQuAD v1.1 file in the tiny vocabulary: `articles` articles of two paragraphs."""
    cities = ["paris", "london", "berlin", "new york"]
    data = []
    for a in range(articles):
        paragraphs = []
        for p in range(2):
            person, city = ["john", "mary"][p], cities[(a + p) % len(cities)]
            context = (
                f"{person} smith lives in {city} . the river ran by the house . the cat sat on the mat ."
            )
            qas = [
                {
                    "id": f"q{a}-{p}",
                    "question": f"where does {person} live ?",
                    "answers": [{"text": city, "answer_start": context.index(city)}],
                }
            ]
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": f"article{a}", "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path
