"""What the readers produce, and the file plumbing they share.

The example types and `DataError` live here, apart from the readers, so that a reader helper
(`race_spans`) can use them without importing `readers` back.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class DataError(ValueError):
    """Malformed input; the message names the file and line."""

    def __init__(self, path: str | Path, line: int | None, problem: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")


@dataclass
class ClassifyExample:
    text: str
    text_pair: str | None
    label: str | None
    group: str = ""


@dataclass
class NERExample:
    words: list[str]
    tags: list[str]
    group: str = ""


@dataclass
class ChoiceExample:
    context: str
    question: str | None
    choices: list[str]
    label: int | None
    group: str = ""


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = field(default_factory=list)  # (text, char start)
    is_impossible: bool = False
    group: str = ""


def open_text(path: str | Path) -> io.TextIOBase:
    """utf-8-sig drops a BOM; `.gz` files are read through gzip."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def base_suffix(path: str | Path) -> str:
    suffixes = [s.lower() for s in Path(path).suffixes if s.lower() != ".gz"]
    return suffixes[-1] if suffixes else ""


def first_line(path: str | Path) -> str:
    with open_text(path) as f:
        for line in f:
            if line.strip():
                return line.rstrip("\r\n")
    raise DataError(path, None, "file is empty")


def json_lines(path: str | Path) -> Iterator[tuple[int, dict]]:
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(path, n, f"invalid JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise DataError(path, n, "expected a JSON object per line")
            yield n, row


def parse_label(value: str, n_choices: int, path, line: int) -> int:
    value = str(value).strip()
    if len(value) == 1 and value.isalpha():
        label = ord(value.upper()) - ord("A")
    else:
        try:
            label = int(value)
        except ValueError:
            raise DataError(path, line, f"label {value!r} is not a choice index or letter") from None
    if not 0 <= label < n_choices:
        raise DataError(path, line, f"label {value!r} is out of range for {n_choices} choices")
    return label
