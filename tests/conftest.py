"""Session fixtures shared by every test folder: tiny real checkpoints and bundles from one factory
(TinyModels), each made once per session (export_bundle takes seconds; every live server and every
export test reuses the same files)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from processing.tasks import TASK_NAMES
from tests.helpers.tiny import make_tiny_checkpoint

TASKS = TASK_NAMES


# Where PYTHONDONTWRITEBYTECODE is set (this machine sets it), each of the suite's dozens of server
# subprocesses would compile the repository's modules again: the suite caches bytecode instead.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def pytest_configure(config) -> None:
    """One torch thread: tiny models gain nothing from more, and two threads on a busy
    2-core machine spin against each other (measured 20x slower)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


MAX_SEQ_LEN = 64  # short windows: long-input tests stay small


class TinyModels:
    """The one factory of tiny checkpoints and bundles: each is made once per session, whoever asks
    first, and shared by every test folder (export_bundle takes seconds). Never modify what it
    returns; copy it first (make_models_dir, bundle_copy)."""

    def __init__(self, root: Path):
        self.root = root
        self.made: dict[tuple, Path] = {}
        self.specs: dict[tuple, tuple] = {}

    def checkpoint(
        self, task: str, seed: int = 0, labels: tuple[str, ...] = (), model_type: str = "bert"
    ) -> Path:
        key = ("checkpoint", task, seed, labels, model_type)
        if key not in self.made:
            directory = self.root / "checkpoints" / f"{task}-{len(self.made)}"
            self.made[key] = make_tiny_checkpoint(
                task, directory, seed=seed, labels=list(labels) or None, model_type=model_type
            )
        return self.made[key]

    def bundle(
        self,
        task: str,
        *,
        seed: int = 0,
        labels: tuple[str, ...] = (),
        variants: tuple[str, ...] | None = None,
        models: str = "models",
        name: str | None = None,
        model_type: str = "bert",
    ) -> Path:
        """The bundle ROOT/<models>/<task>: a `models` folder is one MODELS_DIR, one bundle per task."""
        from export import export_bundle
        from export.pipeline import VARIANTS

        variants = tuple(variants or VARIANTS)
        key = ("bundle", models, task)
        spec = (seed, labels, variants, name, model_type)
        if key not in self.made:
            self.specs[key] = spec
            self.made[key] = export_bundle(
                self.checkpoint(task, seed, labels, model_type),
                self.root / models / task,
                max_seq_len=MAX_SEQ_LEN,
                variants=variants,
                name=name,
            )
        assert self.specs[key] == spec, f"{models}/{task} exists, made otherwise"
        return self.made[key]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def app_bundles(tiny_models) -> dict[str, Path]:
    """Every task's tiny bundle (seed 0, every variant), side by side in one MODELS_DIR."""
    return {task: tiny_models.bundle(task, name=f"tiny-{task}") for task in TASKS}


TOPICS = ["sports", "politics", "science"]


@pytest.fixture(scope="session")
def other_bundles(tiny_models) -> dict[str, Path]:
    """A second classify model (other weights, three topic labels) and a second NER model (other
    weights), int8 only: for serving several models of one task side by side."""
    int8 = ("int8",)
    return {
        "classify": tiny_models.bundle(
            "classify", seed=1, labels=tuple(TOPICS), variants=int8, models="other", name="other-classify"
        ),
        "ner": tiny_models.bundle("ner", seed=1, variants=int8, models="other", name="other-ner"),
    }


@pytest.fixture(scope="session")
def regression_bundle(tiny_models) -> Path:
    """A one-output classify bundle (problem_type regression), fp32 + int8 only, alone in its folder."""
    return tiny_models.bundle(
        "classify", labels=("similarity",), variants=("fp32", "int8"), models="regression", name="sts"
    )


@pytest.fixture(scope="session")
def keyless_live(models_dir, tmp_path_factory):
    """A real uvicorn process on the tiny bundles, with no API key and the fused variant on CPU:
    shared by the docs in a browser (tests/deploy) and live evaluation (tests/train, which scores
    the bundle's "fused" offline). The reliability tests have their own, with a key."""
    from tests.reliability.live import start_server

    server = start_server(models_dir, tmp_path_factory.mktemp("keyless-live"), CPU_VARIANT="fused")
    try:
        assert server.wait_ready().status_code == 200, server.log_text()
        yield server
    finally:
        server.stop()


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
