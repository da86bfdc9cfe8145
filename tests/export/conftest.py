"""The export tests' tiny checkpoints and bundles: the session's shared ones (tests/conftest.py
TinyModels), for the four fine-tuned tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import MAX_SEQ_LEN  # noqa: F401 - below the tiny model's 128 positions: the bound is ours

TASKS = ("classify", "ner", "multiple-choice", "qa")


@pytest.fixture(scope="session")
def checkpoints(tiny_models) -> dict[str, Path]:
    return {task: tiny_models.checkpoint(task) for task in TASKS}


@pytest.fixture(scope="session")
def bundles(app_bundles) -> dict[str, Path]:
    return {task: app_bundles[task] for task in TASKS}


@pytest.fixture
def bundle_copy(bundles, tmp_path):
    """A private copy of a bundle that a test may damage."""

    def copy(task: str) -> Path:
        return Path(shutil.copytree(bundles[task], tmp_path / f"bundle-{task}"))

    return copy
