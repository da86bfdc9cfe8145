"""The bundle format: read, write and check `bundle.json` and the files it names.

Torch-free on purpose: the serving side imports this with onnxruntime, tokenizers and
numpy only. A bundle directory holds one ONNX file per variant, the tokenizer files,
and `bundle.json` describing the task, labels, I/O names, hashes and the export reports.
"""

from __future__ import annotations

import hashlib
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
BATCH_INVARIANT = {
    "fp32": True,
    "fused": True,
    "int8-rowwise": True,
    "int8-rowwise-avx2": True,
    "int8": False,
    "fp16": None,
}


def batch_invariant(variant: str, device: str | None) -> bool | None:
    """BATCH_INVARIANT as promised on `device`: the checks ran on ONNX Runtime's CPU kernels only."""
    return BATCH_INVARIANT.get(variant) if device == "cpu" else None


VARIANT_NOTES = {
    "int8-rowwise": "INT8 with per-token activation scales: a row's outputs do not depend on its batch",
    "int8-rowwise-avx2": "INT8 with per-token activation scales and weights whose adjacent pairs fit 16-bit "
    "sums, exact at INT8 speed on CPUs without VNNI: a row's outputs do not depend on its batch",
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
    # only when no other classify model serves (app.engine.registry); set by training or export.
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
    if not isinstance(data, dict):
        raise BundleError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise BundleError(f"{where}: missing key(s) {', '.join(missing)}")


# A manifest is written by export: a few kB. Anything far larger or deeper is not one, and is refused
# before the JSON parser could recurse through it.
MAX_MANIFEST_BYTES = 4 << 20
MAX_MANIFEST_DEPTH = 32
# Longer than any BERT-family position table we serve; a larger max_seq_len would make warm-up
# tokenize and run absurd batches (minutes, gigabytes) before the model could be refused.
MAX_SEQ_LEN_CEILING = 8192
# field -> (allowed types, what the message says). bool is excluded from int on purpose.
FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "format_version": ((int,), "an integer"),
    "task": ((str,), "a string"),
    "name": ((str,), "a string"),
    "labels": ((list, type(None)), "a list of strings or null"),
    "problem_type": ((str, type(None)), "a string or null"),
    "max_seq_len": ((int,), "an integer"),
    "do_lower_case": ((bool,), "true or false"),
    "inputs": ((list,), "a list"),
    "outputs": ((list,), "a list"),
    "variants": ((dict,), "an object"),
    "tokenizer_files": ((dict,), "an object"),
    "qa_defaults": ((dict, type(None)), "an object or null"),
    "pooling": ((dict, type(None)), "an object or null"),
    "preprocessing": ((dict,), "an object"),
    "reranker": ((bool,), "true or false"),
    "verification": ((dict,), "an object"),
    "optimization": ((dict,), "an object"),
    "quantization": ((dict,), "an object"),
    "versions": ((dict,), "an object"),
    "model": ((dict,), "an object"),
    "created_at": ((str,), "a string"),
}


def _json_depth(text: str) -> int:
    """How deeply brackets nest in a JSON text (strings skipped), without recursing."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _check_types(data: dict[str, Any], where: str) -> None:
    for key, (types, words) in FIELD_TYPES.items():
        if key in data and (
            not isinstance(data[key], types) or (bool not in types and isinstance(data[key], bool))
        ):
            raise BundleError(f"{where}: {key} must be {words}, got {json.dumps(data[key])[:60]}")
    if data.get("labels") is not None and not all(isinstance(x, str) for x in data["labels"]):
        raise BundleError(f"{where}: labels must be a list of strings")
    for key in ("inputs", "outputs"):
        if not all(isinstance(x, dict) and isinstance(x.get("name"), str) for x in data[key]):
            raise BundleError(f"{where}: every entry of {key} must be an object with a string name")
    if data.get("qa_defaults") and not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_SEQ_LEN_CEILING
        for v in data["qa_defaults"].values()
    ):
        raise BundleError(f"{where}: qa_defaults must map names to positive integers")
    ceiling = MAX_SEQ_LEN_CEILING
    positions = data.get("model", {}).get("max_position_embeddings")
    if isinstance(positions, int) and not isinstance(positions, bool):
        ceiling = min(ceiling, positions)
    if not 8 <= data["max_seq_len"] <= ceiling:
        raise BundleError(
            f"{where}: max_seq_len {data['max_seq_len']} is outside 8..{ceiling} "
            "(the position table, and at most MAX_SEQ_LEN_CEILING)"
        )


def _check_entry(info: Any, where: str) -> None:
    _require(info, ("sha256", "bytes"), where)
    if not isinstance(info["sha256"], str) or len(info["sha256"]) != 64:
        raise BundleError(f"{where}: sha256 must be 64 hex digits")
    if not isinstance(info["bytes"], int) or isinstance(info["bytes"], bool) or info["bytes"] < 0:
        raise BundleError(f"{where}: bytes must be a non-negative integer")


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
    _check_types(data, where)
    if data["format_version"] > FORMAT_VERSION:
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
        _check_entry(info, f"{where}: variant {name!r}")
        if not isinstance(info["file"], str):
            raise BundleError(f"{where}: variant {name!r} file must be a string")
        disabled = info.get("disabled_optimizers", [])
        if not isinstance(disabled, list) or not all(isinstance(x, str) for x in disabled):
            raise BundleError(f"{where}: variant {name!r} disabled_optimizers must be a list of names")
        _check_file_name(info["file"], f"variant {name!r}")
        if str(info["precision"]) not in PRECISIONS or str(info["intended_device"]) not in DEVICES:
            raise BundleError(
                f"{where}: variant {name!r} has precision {info['precision']!r} / device "
                f"{info['intended_device']!r}; expected {PRECISIONS} / {DEVICES}"
            )
        variants[name] = VariantInfo(**{k: info[k] for k in required}, disabled_optimizers=disabled)
    tokenizer_files = {}
    for fname, info in data["tokenizer_files"].items():
        _check_file_name(fname, "tokenizer")
        _check_entry(info, f"{where}: tokenizer file {fname!r}")
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
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        size = path.stat().st_size
        raise BundleError(f"{path} is {size} bytes: no manifest is larger than {MAX_MANIFEST_BYTES}")
    try:
        text = path.read_text(encoding="utf-8")
        if _json_depth(text) > MAX_MANIFEST_DEPTH:
            raise BundleError(f"{path} nests deeper than {MAX_MANIFEST_DEPTH} levels: not a manifest")
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
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
    import io

    import numpy as np

    # Checked on the very bytes then parsed: the file is never read twice.
    data = (Path(bundle_dir) / dense["file"]).read_bytes()
    if len(data) != dense["bytes"] or hashlib.sha256(data).hexdigest() != dense["sha256"]:
        raise BundleError(f"{dense['file']} does not match the size and sha256 {MANIFEST_NAME} lists")
    with np.load(io.BytesIO(data)) as arrays:
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
