"""The model repository on disk: MODELS_DIR/<model>/ holds one bundle, or numbered versions.

    MODELS_DIR/
      sst2/bundle.json ...            flat: one version, named by its manifest digest
      news/1/bundle.json ...          versioned (as Triton's model repository): the highest
      news/2/bundle.json ...          number whose bundle verifies is served

A version is identified by its directory number, or for a flat bundle by the first 12 hex
digits of the sha256 of its bundle.json (which lists every file's sha256, so the digest
changes whenever any file does). Hidden directories (export's `.name.partial-*` staging
directories among them) and directories without bundle.json are not versions.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from app.errors import InvalidModelName
from export.bundle import MANIFEST_NAME

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DIGEST_CHARS = 12


@dataclass(frozen=True)
class VersionDir:
    model: str
    version: str
    path: Path
    number: int  # ordering: the directory number, 0 for a flat bundle
    signature: tuple  # (name, bytes, mtime_ns) of every file: changes when any file does

    @property
    def digest(self) -> str:
        return manifest_digest(self.path)


def check_model_name(name: str) -> str:
    if not MODEL_NAME.fullmatch(name):
        raise InvalidModelName(
            f"model name {name!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (the name of a directory in MODELS_DIR)"
        )
    return name


def manifest_digest(bundle_dir: Path) -> str:
    return hashlib.sha256((bundle_dir / MANIFEST_NAME).read_bytes()).hexdigest()[:DIGEST_CHARS]


def _signature(directory: Path) -> tuple:
    entries = []
    for path in sorted(directory.iterdir()):
        if path.is_file():
            stat = path.stat()
            entries.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


def model_versions(models_dir: Path, name: str) -> list[VersionDir]:
    """The versions of one model on disk, newest first (empty when it has none)."""
    root = models_dir / check_model_name(name)
    if not root.is_dir():
        return []
    if (root / MANIFEST_NAME).is_file():
        return [VersionDir(name, manifest_digest(root), root, 0, _signature(root))]
    numbered = [
        p for p in root.iterdir() if p.is_dir() and p.name.isdigit() and (p / MANIFEST_NAME).is_file()
    ]
    numbered.sort(key=lambda p: int(p.name), reverse=True)
    return [VersionDir(name, str(int(p.name)), p, int(p.name), _signature(p)) for p in numbered]


def scan(models_dir: Path) -> dict[str, list[VersionDir]]:
    """Every model directory with at least one version, by name."""
    found = {}
    for root in sorted(models_dir.iterdir()):
        if not root.is_dir() or root.name.startswith(".") or not MODEL_NAME.fullmatch(root.name):
            continue
        versions = model_versions(models_dir, root.name)
        if versions:
            found[root.name] = versions
    return found


def fingerprint(versions: list[VersionDir]) -> tuple:
    """What the poller compares: any new, removed or rewritten version changes it."""
    return tuple((v.version, v.signature) for v in versions)
