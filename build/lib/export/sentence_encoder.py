"""Read how a sentence encoder pools: a sentence-transformers folder, or a plain BertModel.

A sentence-transformers folder lists its modules in `modules.json`, in order: a Transformer (the
BERT checkpoint, in the folder itself or a sub-folder such as `0_Transformer/`, with
`sentence_bert_config.json`), a Pooling (`1_Pooling/config.json`), and optionally a Normalize.
Any other module (Dense, LayerNorm, a second pooling) would change the vectors, so it is refused
by name rather than silently dropped. A plain BertModel checkpoint pools as sentence-transformers
wraps one: mean, not normalized, unless the caller says otherwise. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processing.embed import POOLING_MODES

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


@dataclass(frozen=True)
class Pooling:
    mode: str  # mean | cls | max
    normalize: bool  # the model's own vectors are L2-normalized (a Normalize module)
    source: str  # where the rule was read from
    checkpoint: Path  # the BERT checkpoint directory (config.json, weights, tokenizer)
    max_seq_length: int | None = None  # sentence-transformers' truncation length, if it sets one

    def manifest(self, dimensions: int) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "normalize": self.normalize,
            "dimensions": dimensions,
            "source": self.source,
        }


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


def read_sentence_transformers(folder: Path) -> Pooling:
    modules = _read_json(folder / MODULES)
    if not isinstance(modules, list) or not modules:
        raise SentenceEncoderError(f"{folder / MODULES}: expected a non-empty list of modules")
    kinds = [_module_kind(m) for m in modules]
    expected = ["Transformer", "Pooling"]
    if kinds[:2] != expected or any(k != "Normalize" for k in kinds[2:]):
        raise SentenceEncoderError(
            f"{folder / MODULES} lists modules {kinds}; only Transformer, Pooling and an optional "
            "Normalize can be exported (a Dense or other module would change the vectors)"
        )
    transformer = folder / modules[0].get("path", "")
    pooling_config = folder / modules[1].get("path", "1_Pooling") / "config.json"
    mode = pooling_mode(_read_json(pooling_config), pooling_config)
    max_seq_length = None
    bert_config = transformer / "sentence_bert_config.json"
    if bert_config.is_file():
        settings = _read_json(bert_config)
        max_seq_length = settings.get("max_seq_length")
        if settings.get("do_lower_case"):
            raise SentenceEncoderError(
                f"{bert_config}: do_lower_case lowercases text before the tokenizer, which the bundle's "
                "tokenizer does not repeat; export a folder whose tokenizer lowercases instead"
            )
    if not (transformer / "config.json").is_file():
        raise SentenceEncoderError(f"{transformer} (module 0 of {folder / MODULES}) has no config.json")
    normalize = len(kinds) > 2
    source = f"sentence-transformers folder: {' + '.join(kinds)} ({modules[1].get('path', '1_Pooling')})"
    return Pooling(mode, normalize, source, transformer, max_seq_length)


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
        found = Pooling(mode, found.normalize, "--pooling", found.checkpoint, found.max_seq_length)
    if normalize is not None and normalize != found.normalize:
        found = Pooling(
            found.mode, normalize, f"{found.source}; normalize given", found.checkpoint, found.max_seq_length
        )
    return found


def is_sentence_transformers(checkpoint: Path) -> bool:
    return (checkpoint / MODULES).is_file()
