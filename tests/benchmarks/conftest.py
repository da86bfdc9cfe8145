"""The benchmark smoke tests' tiny checkpoints and bundles: the session's shared ones
(tests/conftest.py TinyModels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoints(tiny_models) -> dict[str, Path]:
    return {task: tiny_models.checkpoint(task) for task in ("classify", "qa", "ner")}


@pytest.fixture(scope="session")
def tiny_bundles(app_bundles) -> dict[str, Path]:
    return {task: app_bundles[task] for task in ("classify", "qa")}


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
