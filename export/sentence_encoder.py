"""Read how a sentence encoder pools: a sentence-transformers folder, or a plain BertModel.

A sentence-transformers folder lists its modules in `modules.json`, in order: a Transformer (the
encoder checkpoint, in the folder itself or a sub-folder such as `0_Transformer/`, with
`sentence_bert_config.json`), a Pooling (`1_Pooling/config.json`), any Dense layers (a linear map
and an activation on the pooled vector, which serving repeats from the bundle's `dense.npz`), and
optionally a Normalize. Any other module (LayerNorm, a second pooling, a Dense on token states)
would change the vectors, so it is refused by name rather than silently dropped. The prompts of
`config_sentence_transformers.json` (e5's "query: " ...) travel with the bundle. A plain encoder
checkpoint pools as sentence-transformers wraps one: mean, not normalized, unless the caller says
otherwise. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from processing.embed import POOLING_MODES

from .bundle import file_info

MODULES = "modules.json"
# sentence-transformers' legacy Pooling keys, one boolean per mode.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


class SentenceEncoderError(ValueError):
    """The folder describes an encoder this export cannot reproduce."""


CONFIG_ST = "config_sentence_transformers.json"
DENSE_FILE = "dense.npz"
# Dense activations serving repeats (processing.embed.DENSE_ACTIVATIONS), by their torch class path.
DENSE_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}


@dataclass(frozen=True)
class Dense:
    """One sentence-transformers Dense module: activation(weight @ vector + bias)."""

    weight: np.ndarray  # [out, in]
    bias: np.ndarray | None  # [out]
    activation: str  # a DENSE_ACTIVATIONS value
    source: str


@dataclass(frozen=True)
class Pooling:
    mode: str  # mean | cls | max
    normalize: bool  # the model's own vectors are L2-normalized (a Normalize module)
    source: str  # where the rule was read from
    checkpoint: Path  # the BERT checkpoint directory (config.json, weights, tokenizer)
    max_seq_length: int | None = None  # sentence-transformers' truncation length, if it sets one
    dense: tuple[Dense, ...] = ()  # applied to the pooled vector, in order, before normalizing
    prompts: dict[str, str] = field(default_factory=dict)  # name -> text put before the input
    default_prompt_name: str | None = None

    def manifest(self, dimensions: int, bundle_dir: Path | None = None) -> dict[str, Any]:
        """bundle.json's `pooling`. Dense layers go into `bundle_dir`/dense.npz (weight_i, bias_i),
        listed with its hash and each layer's activation."""
        pooling: dict[str, Any] = {"mode": self.mode, "normalize": self.normalize, "dimensions": dimensions}
        pooling["source"] = self.source
        if self.dense and bundle_dir is not None:
            pooling["dimensions"] = int(self.dense[-1].weight.shape[0])
            arrays = {f"weight_{i}": layer.weight for i, layer in enumerate(self.dense)}
            arrays.update({f"bias_{i}": d.bias for i, d in enumerate(self.dense) if d.bias is not None})
            np.savez(bundle_dir / DENSE_FILE, **arrays)
            info = file_info(bundle_dir / DENSE_FILE)
            activations = [layer.activation for layer in self.dense]
            pooling["dense"] = {"file": DENSE_FILE, **asdict(info), "activations": activations}
        return pooling

    def prompt_rules(self) -> dict[str, Any]:
        """sentence-transformers' prompts, which serving puts before the texts (TEI's prompt_name)."""
        rules: dict[str, Any] = {"prompts": self.prompts} if self.prompts else {}
        if self.default_prompt_name is not None:
            rules["default_prompt_name"] = self.default_prompt_name
        return rules


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SentenceEncoderError(f"{path}: cannot read it as JSON: {e}") from e


def pooling_mode(config: dict[str, Any], where: Path) -> str:
    """The one pooling mode a Pooling config selects (new `pooling_mode` or legacy booleans)."""
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in LEGACY_POOLING_KEYS.items() if config.get(key)]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1:
        raise SentenceEncoderError(
            f"{where}: pooling modes {modes or 'none'}; exactly one of {', '.join(POOLING_MODES)} is "
            "supported (concatenated poolings are not)"
        )
    if modes[0] not in POOLING_MODES:
        raise SentenceEncoderError(
            f"{where}: pooling mode {modes[0]!r} is not supported; supported: {', '.join(POOLING_MODES)}"
        )
    return modes[0]


def _module_kind(module: dict[str, Any]) -> str:
    # "sentence_transformers.models.Pooling" and newer module paths end in the same class name.
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def read_dense(folder: Path) -> Dense:
    """A Dense module's folder: config.json (in/out features, bias, activation) and its weights."""
    config = _read_json(folder / "config.json")
    activation_path = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    if activation_path not in DENSE_ACTIVATIONS:
        raise SentenceEncoderError(
            f"{folder}/config.json: Dense activation {activation_path!r} is not supported; supported: "
            f"{', '.join(DENSE_ACTIVATIONS)}"
        )
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "sentence_embedding") != "sentence_embedding":
            raise SentenceEncoderError(
                f"{folder}/config.json: a Dense on {config[key]!r} (not the pooled sentence_embedding) "
                "cannot be exported"
            )
    if (folder / "model.safetensors").is_file():
        from safetensors.numpy import load_file

        state = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        import torch  # export only: serving reads the bundle's dense.npz

        state = {k: v.numpy() for k, v in torch.load(folder / "pytorch_model.bin", weights_only=True).items()}
    else:
        raise SentenceEncoderError(f"{folder}: a Dense module without model.safetensors or pytorch_model.bin")
    weight = np.asarray(state["linear.weight"], dtype=np.float32)
    expected = (
        int(config.get("out_features", weight.shape[0])),
        int(config.get("in_features", weight.shape[1])),
    )
    if weight.shape != expected:
        raise SentenceEncoderError(f"{folder}: linear.weight is {weight.shape}, config.json says {expected}")
    bias = np.asarray(state["linear.bias"], dtype=np.float32) if config.get("bias", True) else None
    return Dense(weight, bias, DENSE_ACTIVATIONS[activation_path], str(folder.name))


def read_prompts(folder: Path) -> tuple[dict[str, str], str | None]:
    """config_sentence_transformers.json's prompts (name -> text) and default_prompt_name."""
    if not (folder / CONFIG_ST).is_file():
        return {}, None
    config = _read_json(folder / CONFIG_ST)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise SentenceEncoderError(f"{folder / CONFIG_ST}: prompts must map names to texts")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise SentenceEncoderError(f"{folder / CONFIG_ST}: default_prompt_name {default!r} is not a prompt")
    return {str(k): v for k, v in prompts.items()}, default


def read_sentence_transformers(folder: Path) -> Pooling:
    modules = _read_json(folder / MODULES)
    if not isinstance(modules, list) or not modules:
        raise SentenceEncoderError(f"{folder / MODULES}: expected a non-empty list of modules")
    kinds = [_module_kind(m) for m in modules]
    tail = kinds[2:-1] if kinds[-1:] == ["Normalize"] and len(kinds) > 2 else kinds[2:]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Dense" for k in tail):
        raise SentenceEncoderError(
            f"{folder / MODULES} lists modules {kinds}; only Transformer, Pooling, Dense layers and a "
            "final Normalize can be exported (another module would change the vectors)"
        )
    transformer = folder / modules[0].get("path", "")
    pooling_config = folder / modules[1].get("path", "1_Pooling") / "config.json"
    pooling_settings = _read_json(pooling_config)
    mode = pooling_mode(pooling_settings, pooling_config)
    if pooling_settings.get("include_prompt", True) is False:
        raise SentenceEncoderError(
            f"{pooling_config}: include_prompt false pools without the prompt's tokens, which serving "
            "does not repeat"
        )
    dense = tuple(
        read_dense(folder / m.get("path", "")) for m, k in zip(modules, kinds, strict=True) if k == "Dense"
    )
    prompts, default_prompt = read_prompts(folder)
    max_seq_length = None
    bert_config = transformer / "sentence_bert_config.json"
    tokenizer_config = transformer / "tokenizer_config.json"
    if tokenizer_config.is_file():  # sentence-transformers 6 keeps max_seq_length here
        length = _read_json(tokenizer_config).get("model_max_length")
        max_seq_length = length if isinstance(length, int) and length < 1_000_000 else None
    if bert_config.is_file():
        settings = _read_json(bert_config)
        max_seq_length = settings.get("max_seq_length", max_seq_length)
        if settings.get("do_lower_case"):
            raise SentenceEncoderError(
                f"{bert_config}: do_lower_case lowercases text before the tokenizer, which the bundle's "
                "tokenizer does not repeat; export a folder whose tokenizer lowercases instead"
            )
    if not (transformer / "config.json").is_file():
        raise SentenceEncoderError(f"{transformer} (module 0 of {folder / MODULES}) has no config.json")
    normalize = kinds[-1] == "Normalize"
    source = f"sentence-transformers folder: {' + '.join(kinds)} ({modules[1].get('path', '1_Pooling')})"
    return Pooling(mode, normalize, source, transformer, max_seq_length, dense, prompts, default_prompt)


def read_pooling(checkpoint: Path, mode: str | None = None, normalize: bool | None = None) -> Pooling:
    """The pooling of `checkpoint`: its sentence-transformers modules, else mean and not
    normalized (a plain BertModel, as sentence-transformers wraps one); `mode` / `normalize` given
    by the caller replace what the folder says."""
    if (checkpoint / MODULES).is_file():
        found = read_sentence_transformers(checkpoint)
    else:
        found = Pooling("mean", False, "default for a plain encoder (sentence-transformers' own)", checkpoint)
    if mode is not None:
        if mode not in POOLING_MODES:
            raise SentenceEncoderError(f"pooling {mode!r} is not one of {', '.join(POOLING_MODES)}")
        found = replace(found, mode=mode, source="--pooling")
    if normalize is not None and normalize != found.normalize:
        found = replace(found, normalize=normalize, source=f"{found.source}; normalize given")
    return found


def is_sentence_transformers(checkpoint: Path) -> bool:
    return (checkpoint / MODULES).is_file()
