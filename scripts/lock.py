"""Write the lock files `requirements/*.txt`: every package of an install group pinned with its hashes.

    python scripts/lock.py                 # pins = the versions installed where the suite passed
    python scripts/lock.py --tested F.txt  # pins from a `pip freeze` file instead

Each lock is resolved by `uv pip compile` from pyproject.toml, constrained to the tested versions
(a `pip freeze` of the environment the suite passed in), for every platform (`--universal`).
torch is left out (`make` and the Dockerfile install the CPU build `torch==2.13.0` first), but its
own dependencies are in the lock, resolved against the CPU wheel: pip's configured find-links when
there are some, else PyTorch's CPU index. The first line records the digest of pyproject.toml's
dependency lists; tests/test_lock.py fails when they change and the locks were not written again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "requirements"
# lock file -> pyproject extras. dev: what `make` installs; train: the image's builder stage.
LOCKS = {"serve": ["serve"], "serve-gpu": ["serve-gpu"], "train": ["train"], "dev": ["serve", "train", "dev"]}
LEFT_OUT = ("torch",)  # installed first, from the CPU index
PYTHON = "3.11"  # the image's; requires-python's floor
DIGEST_LINE = "# pyproject-dependencies-sha256: "


def inputs_digest(pyproject: Path = ROOT / "pyproject.toml") -> str:
    project = tomllib.loads(pyproject.read_text())["project"]
    inputs = {k: project.get(k) for k in ("requires-python", "dependencies", "optional-dependencies")}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def tested_versions() -> str:
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return "\n".join(line for line in frozen.splitlines() if "==" in line)


def torch_source() -> list[str]:
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if links:
        return [arg for link in links for arg in ("--find-links", link)]
    return [
        "--extra-index-url",
        "https://download.pytorch.org/whl/cpu",
        "--index-strategy",
        "unsafe-best-match",
    ]


def compile_lock(name: str, extras: list[str], constraints: Path) -> str:
    command = [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", "--quiet"]
    command += [arg for extra in extras for arg in ("--extra", extra)]
    command += [
        "--generate-hashes",
        "--universal",
        "--python-version",
        PYTHON,
        "--no-annotate",
        "--no-header",
    ]
    command += ["-c", str(constraints), *torch_source()]
    command += [arg for package in LEFT_OUT for arg in ("--no-emit-package", package)]
    locked = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    header = (
        f"# Lock of pyproject.toml's {' + '.join(extras)} group(s), with hashes: written by "
        "`python scripts/lock.py`; do not edit.\n"
        f"# Install with `pip install --require-hashes -r requirements/{name}.txt`"
        + (" after torch==2.13.0 (CPU).\n" if "train" in extras else ".\n")
    )
    return f"{DIGEST_LINE}{inputs_digest()}\n{header}{locked}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tested", type=Path, help="a `pip freeze` of the tested environment")
    args = parser.parse_args()
    tested = args.tested.read_text() if args.tested else tested_versions()
    OUT.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write(tested + "\n")  # torch's pin too: the CPU build, whose dependencies differ
        constraints.flush()
        for name, extras in LOCKS.items():
            (OUT / f"{name}.txt").write_text(compile_lock(name, extras, Path(constraints.name)))
            print(f"requirements/{name}.txt")


if __name__ == "__main__":
    main()
