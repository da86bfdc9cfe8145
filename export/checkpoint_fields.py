"""What a bundle's manifest records from the checkpoint beside the graph: labels and problem type,
tokenizer files and casing, the training-time preprocessing rules serving repeats, QA defaults,
and the versions of the tools that built it."""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from model.architectures import architecture
from processing.qa import window_capacity
from processing.tasks import TASKS
from processing.tokenizer import TOKENIZER_FILES, TextTokenizer
from processing.words import WORD_SPLITS

from .bundle import DEFAULT_QA, file_info
from .onnx_export import ExportError


def tool_versions() -> dict[str, str]:
    out = {}
    for package in ("torch", "onnx", "onnxruntime", "transformers", "numpy", "tokenizers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def do_lower_case(checkpoint_dir: Path) -> bool:
    config_file = checkpoint_dir / "tokenizer_config.json"
    if config_file.is_file():
        value = json.loads(config_file.read_text(encoding="utf-8")).get("do_lower_case")
        if value is not None:
            return bool(value)
    tokenizer_file = checkpoint_dir / "tokenizer.json"
    if tokenizer_file.is_file():
        normalizer = json.loads(tokenizer_file.read_text(encoding="utf-8")).get("normalizer") or {}
        return bool(normalizer.get("lowercase", False))
    return True  # BERT's uncased default, as BertTokenizer assumes


def labels_and_problem(config, task: str) -> tuple[list[str] | None, str | None]:
    """Labels from id2label; for classify, regression as `transformers` decides it: problem_type, or
    a single output."""
    if not TASKS[task].labelled:
        return None, None
    id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
    if sorted(id2label) != list(range(len(id2label))):
        raise ExportError(f"config id2label keys {sorted(id2label)} are not 0..{len(id2label) - 1}")
    labels = [id2label[i] for i in range(len(id2label))]
    if task == "ner":
        return labels, None
    if config.problem_type == "multi_label_classification":
        raise ExportError(
            "config.json has problem_type 'multi_label_classification': the service scores labels with "
            "a softmax, which is wrong for independent labels; multi-label export is not supported"
        )
    if config.problem_type == "regression" and len(labels) != 1:
        raise ExportError(
            f"config.json has problem_type 'regression' with {len(labels)} outputs; the service serves "
            "one regression value"
        )
    return labels, "regression" if len(labels) == 1 else "single_label_classification"


def preprocessing_rules(config, task: str) -> dict[str, Any]:
    """Training-time rules serving must repeat (processing.words), as recorded by train.train;
    `text_pair`: a classify model trained on pairs (the reranker /rerank takes by default)."""
    keys = ("word_split", "window_overlap", "text_pair")
    recorded = {k: config.extra[k] for k in keys if k in config.extra}
    if task == "ner" and recorded.get("word_split", WORD_SPLITS[0]) not in WORD_SPLITS:
        raise ExportError(f"config word_split {recorded['word_split']!r} is not one of {WORD_SPLITS}")
    return recorded


def is_reranker(config, task: str, override: bool | None) -> bool:
    """The model's role: `override` (export's --reranker, a defaults.json entry), else what training
    recorded in config.json (`reranker`, set for classify on squad-sentences pairs)."""
    marked = bool(config.extra.get("reranker", False)) if override is None else override
    if marked and task != "classify":
        raise ExportError(f"only a classify model can be a reranker; this checkpoint is {task}")
    return marked


def qa_defaults_for(overrides: dict[str, int] | None, max_seq_len: int, specials: int = 3) -> dict[str, int]:
    """SQuAD-style defaults, shrunk to fit short windows unless the caller set them; `specials`: the
    tokenizer's special tokens around a pair (BERT 3, RoBERTa 4)."""
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(DEFAULT_QA)
    if unknown:
        raise ExportError(f"unknown qa_defaults key(s) {sorted(unknown)}; known: {sorted(DEFAULT_QA)}")
    merged = dict(DEFAULT_QA)
    short_query = min(DEFAULT_QA["max_query_len"], max_seq_len // 4)
    merged["max_query_len"] = overrides.get("max_query_len", short_query)
    capacity = window_capacity(max_seq_len, merged["max_query_len"], specials)
    merged["doc_stride"] = overrides.get("doc_stride", min(DEFAULT_QA["doc_stride"], capacity // 2))
    merged["max_answer_len"] = overrides.get("max_answer_len", DEFAULT_QA["max_answer_len"])
    for key, value in merged.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExportError(f"qa_defaults[{key!r}] must be a positive int, got {value!r}")
    if merged["doc_stride"] >= capacity:
        raise ExportError(
            f"qa doc_stride {merged['doc_stride']} must be smaller than the context window "
            f"max_seq_len {max_seq_len} - max_query_len {merged['max_query_len']} - {specials} = {capacity}"
        )
    return merged


def copy_tokenizer(checkpoint_dir: Path, stage: Path) -> dict[str, Any]:
    copied = {}
    for name in TOKENIZER_FILES:
        if (checkpoint_dir / name).is_file():
            shutil.copyfile(checkpoint_dir / name, stage / name)
            copied[name] = file_info(stage / name)
    if "vocab.txt" not in copied and "tokenizer.json" not in copied:
        raise ExportError(
            f"{checkpoint_dir} has neither vocab.txt nor tokenizer.json: the bundle needs a tokenizer "
            "(RoBERTa, XLM-R: save the fast tokenizer, which writes tokenizer.json)"
        )
    return copied


def check_tokenizer(checkpoint_dir: Path, config) -> TextTokenizer:
    """The tokenizer serving will use, loaded now: one it cannot read, or one that pads with another
    id than the model's (RoBERTa reads its positions off the padding id), fails the export."""
    try:
        tokenizer = TextTokenizer.from_dir(checkpoint_dir)
    except (ValueError, OSError, Exception) as e:  # tokenizers raises its own Exception type
        raise ExportError(f"{checkpoint_dir}: the tokenizer does not load: {e}") from e
    if tokenizer.vocab_size > config.vocab_size:
        raise ExportError(
            f"{checkpoint_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
            f"table {config.vocab_size}: ids past it cannot be embedded"
        )
    if tokenizer.pad_id != config.pad_token_id and architecture(config.model_type).positions_skip_padding:
        raise ExportError(
            f"{checkpoint_dir}: the tokenizer pads with id {tokenizer.pad_id} but config.json has "
            f"pad_token_id {config.pad_token_id}; {config.model_type} counts positions past the padding id"
        )
    return tokenizer
