"""The bundle format: read, write and check `bundle.json` and the files it names.

Torch-free on purpose: the serving side imports this with onnxruntime, tokenizers and
numpy only. A bundle directory holds one ONNX file per variant, the tokenizer files,
and `bundle.json` describing the task, labels, I/O names, hashes and the export reports.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from processing.embed import POOLING_MODES
from processing.files import sha256_file
from processing.tasks import TASK_NAMES
from processing.tasks import TASKS as TASK_SPECS

FORMAT_VERSION = 1
MANIFEST_NAME = "bundle.json"
TASKS = TASK_NAMES
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
PRECISIONS = ("fp32", "fp16", "int8")
DEVICES = ("cpu", "cuda", "any")
DEFAULT_QA = {"doc_stride": 128, "max_query_len": 64, "max_answer_len": 30}
# Whether a row's outputs are the same alone and in any batch (export checks it, /models states
# it). ORT's dynamic INT8 takes one activation scale over the whole batch, padding included;
# CUDA kernels may pick other algorithms by shape, so fp16 makes no promise.
BATCH_INVARIANT = {"fp32": True, "fused": True, "int8-rowwise": True, "int8": False, "fp16": None}


def batch_invariant(variant: str, device: str | None) -> bool | None:
    """BATCH_INVARIANT as promised on `device`: the checks ran on ONNX Runtime's CPU kernels only."""
    return BATCH_INVARIANT.get(variant) if device == "cpu" else None


VARIANT_NOTES = {
    "int8-rowwise": "INT8 with per-token activation scales: a row's outputs do not depend on its batch",
    "int8": "ORT dynamic INT8, one activation scale per batch: faster, but a row's outputs move "
    "slightly with what shares its batch",
}


class BundleError(ValueError):
    """A bundle is missing, malformed, or its files do not match the manifest."""


def task_io(
    task: str, num_labels: int | None = None, hidden_size: int | None = None
) -> tuple[list[dict], list[dict]]:
    """Input and output tensor specs (name, dtype, symbolic shape) for a task's graph."""
    if task not in TASKS:
        raise BundleError(f"unknown task {task!r}; expected one of {TASKS}")
    spec = TASK_SPECS[task]
    inputs = [{"name": n, "dtype": "int64", "shape": list(spec.token_axes)} for n in INPUT_NAMES]
    shapes = spec.output_shapes(num_labels, hidden_size)
    outputs = [{"name": n, "dtype": "float32", "shape": s} for n, s in shapes.items()]
    return inputs, outputs


@dataclass
class VariantInfo:
    file: str
    sha256: str
    bytes: int
    precision: str  # "fp32" | "fp16" | "int8"
    intended_device: str  # "cpu" | "cuda" | "any"
    # onnxruntime graph optimizers to turn off when loading this file (InferenceSession's
    # disabled_optimizers), e.g. a fusion that would undo a deliberate choice made at export.
    disabled_optimizers: list[str] = field(default_factory=list)


@dataclass
class FileInfo:
    sha256: str
    bytes: int


@dataclass
class BundleManifest:
    format_version: int
    task: str
    name: str
    labels: list[str] | None
    problem_type: str | None
    max_seq_len: int
    do_lower_case: bool
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    variants: dict[str, VariantInfo]
    tokenizer_files: dict[str, FileInfo]
    qa_defaults: dict[str, int] | None = None
    # Sentence encoders (embed): mode (mean | cls | max, pooled in the graph), normalize (what the
    # model's own vectors are), dimensions, source.
    pooling: dict[str, Any] | None = None
    # Rules training used that serving repeats: word_split (NER), window_overlap.
    preprocessing: dict[str, Any] = field(default_factory=dict)
    # A classify model trained to score (query, passage) pairs: /rerank's default, and /classify's
    # only when no other classify model serves (app.models.registry); set by training or export.
    reranker: bool = False
    verification: dict[str, Any] = field(default_factory=dict)
    optimization: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)  # encoder sizes, source checkpoint
    created_at: str = ""

    @property
    def input_names(self) -> list[str]:
        return [spec["name"] for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [spec["name"] for spec in self.outputs]

    def variant_path(self, bundle_dir: str | Path, variant: str) -> Path:
        return Path(bundle_dir) / self._variant(variant).file

    def _variant(self, variant: str) -> VariantInfo:
        if variant not in self.variants:
            raise BundleError(
                f"bundle {self.name!r} has no variant {variant!r}; it has {sorted(self.variants)}"
            )
        return self.variants[variant]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def file_info(path: Path) -> FileInfo:
    return FileInfo(sha256=sha256_file(path), bytes=path.stat().st_size)


def _check_file_name(name: str, what: str) -> None:
    # Manifest entries are opened relative to the bundle: refuse anything that escapes it.
    if not name or name != Path(name).name or name in (".", ".."):
        raise BundleError(f"{what} file name {name!r} must be a plain file name inside the bundle")


def _require(data: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in data]
    if missing:
        raise BundleError(f"{where}: missing key(s) {', '.join(missing)}")


def manifest_from_dict(data: dict[str, Any], where: str = MANIFEST_NAME) -> BundleManifest:
    if not isinstance(data, dict):
        raise BundleError(f"{where}: expected a JSON object, got {type(data).__name__}")
    required = (
        "format_version",
        "task",
        "name",
        "labels",
        "problem_type",
        "max_seq_len",
        "do_lower_case",
        "inputs",
        "outputs",
        "variants",
        "tokenizer_files",
    )
    _require(data, required, where)
    if not isinstance(data["format_version"], int) or data["format_version"] > FORMAT_VERSION:
        raise BundleError(
            f"{where}: format_version {data['format_version']!r} is not supported (this reader knows "
            f"<= {FORMAT_VERSION}); upgrade the server"
        )
    if data["task"] not in TASKS:
        raise BundleError(f"{where}: unknown task {data['task']!r}; expected one of {TASKS}")
    if TASK_SPECS[data["task"]].labelled and not data["labels"]:
        raise BundleError(f"{where}: task {data['task']!r} needs a non-empty labels list")
    if data["task"] == "embed":
        pooling = data.get("pooling")
        if not isinstance(pooling, dict) or pooling.get("mode") not in POOLING_MODES:
            raise BundleError(
                f"{where}: an embed bundle needs pooling.mode, one of {', '.join(POOLING_MODES)}"
            )
        dense = pooling.get("dense")
        if dense is not None:
            _require(dense, ("file", "sha256", "bytes", "activations"), f"{where}: pooling.dense")
            _check_file_name(dense["file"], "pooling.dense")
    if not data["variants"]:
        raise BundleError(f"{where}: no variants listed")
    variants = {}
    required = ("file", "sha256", "bytes", "precision", "intended_device")
    for name, info in data["variants"].items():
        _require(info, required, f"{where}: variant {name!r}")
        disabled = info.get("disabled_optimizers", [])
        if not isinstance(disabled, list) or not all(isinstance(x, str) for x in disabled):
            raise BundleError(f"{where}: variant {name!r} disabled_optimizers must be a list of names")
        _check_file_name(info["file"], f"variant {name!r}")
        if info["precision"] not in PRECISIONS or info["intended_device"] not in DEVICES:
            raise BundleError(
                f"{where}: variant {name!r} has precision {info['precision']!r} / device "
                f"{info['intended_device']!r}; expected {PRECISIONS} / {DEVICES}"
            )
        variants[name] = VariantInfo(**{k: info[k] for k in required}, disabled_optimizers=disabled)
    tokenizer_files = {}
    for fname, info in data["tokenizer_files"].items():
        _check_file_name(fname, "tokenizer")
        _require(info, ("sha256", "bytes"), f"{where}: tokenizer file {fname!r}")
        tokenizer_files[fname] = FileInfo(sha256=info["sha256"], bytes=info["bytes"])
    if not tokenizer_files:
        raise BundleError(f"{where}: no tokenizer files listed")
    known = set(BundleManifest.__dataclass_fields__)
    kwargs = {k: v for k, v in data.items() if k in known}  # newer optional keys are ignored
    kwargs.update(variants=variants, tokenizer_files=tokenizer_files)
    return BundleManifest(**kwargs)


def load_bundle_manifest(bundle_dir: str | Path) -> BundleManifest:
    path = Path(bundle_dir) / MANIFEST_NAME
    if not Path(bundle_dir).is_dir():
        raise BundleError(f"bundle directory {bundle_dir} does not exist")
    if not path.is_file():
        raise BundleError(f"{path} is missing: {bundle_dir} is not a model bundle")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path} is not valid JSON: {e}") from e
    return manifest_from_dict(data, where=str(path))


def _check_file(path: Path, expected: FileInfo | VariantInfo) -> None:
    if not path.is_file():
        raise BundleError(f"{path.name} is missing from bundle {path.parent} (listed in {MANIFEST_NAME})")
    size = path.stat().st_size
    if size != expected.bytes:
        raise BundleError(
            f"{path.name} in {path.parent} is {size} bytes but {MANIFEST_NAME} says {expected.bytes}: "
            "the file is truncated or was replaced"
        )
    if sha256_file(path) != expected.sha256:
        raise BundleError(
            f"{path.name} in {path.parent} does not match its sha256 in {MANIFEST_NAME}: "
            "the file was modified or corrupted"
        )


def verify_bundle_files(bundle_dir: str | Path, manifest: BundleManifest, variant: str) -> None:
    """Check size and sha256 of one variant's ONNX file and of every tokenizer file."""
    bundle_dir = Path(bundle_dir)
    _check_file(bundle_dir / manifest._variant(variant).file, manifest.variants[variant])
    for name, info in manifest.tokenizer_files.items():
        _check_file(bundle_dir / name, info)
    dense = (manifest.pooling or {}).get("dense")
    if dense:
        _check_file(bundle_dir / dense["file"], FileInfo(dense["sha256"], dense["bytes"]))


def dense_layers(bundle_dir: str | Path, manifest: BundleManifest) -> list[tuple[Any, Any, str]]:
    """The sentence encoder's Dense layers (weight, bias or None, activation), in order: [] if none."""
    dense = (manifest.pooling or {}).get("dense")
    if not dense:
        return []
    import numpy as np

    with np.load(Path(bundle_dir) / dense["file"]) as arrays:
        return [
            (arrays[f"weight_{i}"], arrays[f"bias_{i}"] if f"bias_{i}" in arrays else None, activation)
            for i, activation in enumerate(dense["activations"])
        ]


def _jsonable(value: Any) -> Any:
    # Reports may carry numpy scalars / arrays (e.g. from a caller's metric_fn).
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_manifest(bundle_dir: str | Path, manifest: BundleManifest) -> Path:
    """Validate by round-tripping, then write atomically so a reader never sees half a file."""
    data = json.loads(json.dumps(manifest.to_dict(), default=_jsonable))
    manifest_from_dict(data, where="manifest being written")
    path = Path(bundle_dir) / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
