"""Tiny random checkpoints exported once per session, for all four tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.tiny import make_tiny_checkpoint

TASKS = ("classify", "ner", "multiple-choice", "qa")
MAX_SEQ_LEN = 48  # below the tiny model's 128 positions, so the bound is ours, not the table's


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {task: make_tiny_checkpoint(task, root / task) for task in TASKS}


@pytest.fixture(scope="session")
def bundles(checkpoints, tmp_path_factory) -> dict[str, Path]:
    from export import export_bundle

    root = tmp_path_factory.mktemp("bundles")
    return {
        task: export_bundle(ckpt, root / task, max_seq_len=MAX_SEQ_LEN) for task, ckpt in checkpoints.items()
    }


@pytest.fixture
def bundle_copy(bundles, tmp_path):
    """A private copy of a bundle that a test may damage."""

    def copy(task: str) -> Path:
        return Path(shutil.copytree(bundles[task], tmp_path / f"bundle-{task}"))

    return copy
