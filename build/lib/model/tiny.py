"""Tiny random BERT checkpoints with a self-made WordPiece vocab, for fast tests and benchmark smoke runs.

Nothing is downloaded: the vocab is written here and the weights are random
(seeded), saved in our Hugging Face layout.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a an of to in and is was it he she they we you i this that what who where when why how "
    "which on at by for with from as be are not no yes good bad great terrible movie film fun "
    "boring love hate paris france london berlin john mary smith city river born lives works "
    "capital question answer because but or if then there here one two three four five year "
    "new york germany company founded team played won game ball cat dog ran sat mat house"
).split()
TASK_LABELS = {
    "classify": ["negative", "positive"],
    "ner": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"],
    "multiple-choice": None,
    "qa": None,
}


def tiny_vocab() -> list[str]:
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    return SPECIAL + WORDS + chars + ["##" + c for c in string.ascii_lowercase + string.digits]


def write_tokenizer_files(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(tiny_vocab()) + "\n", encoding="utf-8")
    config = {"do_lower_case": True, "tokenizer_class": "BertTokenizer", "model_max_length": 128}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def tiny_sizes() -> dict[str, int]:
    """The tiny encoder's shape, shared by our configs and `transformers`' ones."""
    return dict(
        vocab_size=len(tiny_vocab()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )


def tiny_config(task: str | None = None, labels: list[str] | None = None, **overrides):
    from model.config import BertConfig

    kwargs = dict(**tiny_sizes(), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, task=task)
    kwargs.update(overrides)
    config = BertConfig(**kwargs)
    labels = labels or TASK_LABELS.get(task or "")
    if labels:
        config.id2label = dict(enumerate(labels))
    return config


def make_tiny_checkpoint(
    task: str, directory: Path, seed: int = 0, labels: list[str] | None = None, **overrides
) -> Path:
    """A random checkpoint for `task` ("classify", "ner", "multiple-choice", "qa", "pretrain")."""
    import torch

    from model.bert import TASK_HEADS

    torch.manual_seed(seed)
    model = TASK_HEADS[task](tiny_config(task, labels, **overrides))
    # Random weights with std 0.02 give near-uniform outputs; widen them so tests can
    # tell answers apart.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                p.normal_(0.0, 0.2)
    directory = Path(directory)
    write_tokenizer_files(directory)
    model.save_pretrained(directory, tokenizer_from=directory)
    return directory
