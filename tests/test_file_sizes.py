"""No source file passes about 400 lines without a stated reason.

A long file often holds two ideas; where it holds one, the reason is written here, and a reason for
a file that is no longer long must go, so the list stays true. Tests are not counted: a test file
follows the module it tests.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("model", "train", "processing", "export", "app", "benchmarks", "deploy", "scripts")
LIMIT = 410  # "about 400"

LONGER: dict[str, str] = {
    "model/bert.py": "nanoGPT-style: the whole network and every task head in one readable file",
    "train/features.py": "every task's training features and metrics, one class per task (like the heads)",
    "train/train.py": "`python -m train`: its command line beside the run it drives, read top to bottom",
    "train/trainer.py": "the training loop: steps, evaluation, best checkpoint, resume, TensorBoard",
}


def line_counts() -> dict[str, int]:
    counts = {}
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            counts[path.relative_to(REPO).as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    return counts


def test_long_files_have_a_stated_reason() -> None:
    counts = line_counts()
    unexplained = {path: n for path, n in counts.items() if n > LIMIT and path not in LONGER}
    assert not unexplained, f"over {LIMIT} lines, no reason in LONGER (split it, or say why): {unexplained}"


def test_every_stated_reason_is_for_a_long_file() -> None:
    counts = line_counts()
    stale = {path: counts.get(path) for path in LONGER if counts.get(path, 0) <= LIMIT}
    assert not stale, f"these are no longer long (or gone): drop them from LONGER: {stale}"
