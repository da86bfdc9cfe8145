"""Session fixtures shared by tests/app, tests/deploy and tests/reliability: tiny real bundles,
exported once per session (export_bundle takes seconds; every live server reuses the same files)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from processing.tasks import TASK_NAMES
from tests.helpers.tiny import make_tiny_checkpoint

TASKS = TASK_NAMES


def pytest_configure(config) -> None:
    """One torch thread: tiny models gain nothing from more, and two threads on a busy
    2-core machine spin against each other (measured 20x slower)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


MAX_SEQ_LEN = 64  # short windows: long-input tests stay small


@pytest.fixture(scope="session")
def app_bundles(tmp_path_factory) -> dict[str, Path]:
    from export import export_bundle

    root = tmp_path_factory.mktemp("app-bundles")
    out = {}
    for task in TASKS:
        checkpoint = make_tiny_checkpoint(task, root / "checkpoints" / task)
        out[task] = export_bundle(
            checkpoint, root / "models" / task, max_seq_len=MAX_SEQ_LEN, name=f"tiny-{task}"
        )
    return out


TOPICS = ["sports", "politics", "science"]


@pytest.fixture(scope="session")
def other_bundles(tmp_path_factory) -> dict[str, Path]:
    """A second classify model (other weights, three topic labels) and a second NER model (other
    weights), int8 only: for serving several models of one task side by side."""
    from export import export_bundle

    root = tmp_path_factory.mktemp("other-bundles")
    specs = {"classify": {"labels": TOPICS}, "ner": {}}
    return {
        task: export_bundle(
            make_tiny_checkpoint(task, root / "checkpoints" / task, seed=1, **spec),
            root / "models" / task,
            max_seq_len=MAX_SEQ_LEN,
            variants=("int8",),
            name=f"other-{task}",
        )
        for task, spec in specs.items()
    }


@pytest.fixture(scope="session")
def regression_bundle(tmp_path_factory) -> Path:
    """A one-output classify bundle (problem_type regression), fp32 + int8 only."""
    import torch

    from export import export_bundle
    from model.bert import TASK_HEADS
    from tests.helpers.tiny import tiny_config, write_tokenizer_files

    root = tmp_path_factory.mktemp("regression")
    config = tiny_config("classify")
    config.id2label = {0: "similarity"}
    torch.manual_seed(0)
    write_tokenizer_files(root / "checkpoint")
    TASK_HEADS["classify"](config).save_pretrained(root / "checkpoint", tokenizer_from=root / "checkpoint")
    out = root / "models" / "sts"
    return export_bundle(root / "checkpoint", out, max_seq_len=MAX_SEQ_LEN, variants=("fp32", "int8"))


@pytest.fixture(scope="session")
def models_dir(app_bundles) -> Path:
    """MODELS_DIR holding all four bundles (shared: never modify it)."""
    return next(iter(app_bundles.values())).parent


@pytest.fixture
def make_models_dir(app_bundles, tmp_path):
    """A private MODELS_DIR with copies of some bundles, which a test may damage or rename."""

    def make(tasks: tuple[str, ...] | dict[str, str] = TASKS) -> Path:
        root = tmp_path / f"models-{len(list(tmp_path.iterdir()))}"
        root.mkdir()
        names = tasks if isinstance(tasks, dict) else {task: task for task in tasks}
        for dir_name, task in names.items():
            shutil.copytree(app_bundles[task], root / dir_name)
        return root

    return make
