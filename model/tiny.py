"""Tiny random checkpoints with self-made tokenizers, for fast tests and benchmark smoke runs.

Nothing is downloaded: the vocab is written here (a WordPiece vocab.txt, or a byte-level BPE or
Unigram tokenizer.json trained on a few sentences) and the weights are random (seeded), saved in the
`transformers` layout of their architecture (model/architectures.py).
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


# Sentences the BPE and Unigram tokenizers learn from: accents, CJK, an emoji, long words.
CORPUS = [
    " ".join(WORDS),
    "John Smith lives in New York and works for Acme Corp.",
    "Mary was born in Paris, France; she moved to London in 1999.",
    "café naïve résumé Zürich São Paulo",
    "北京是中国的首都 东京 上海",
    "I love this movie 🙂 so much!",
    "unbelievable internationalization antidisestablishmentarianism",
]
# model_type -> the tokenizer its tiny checkpoint gets, and the config it needs beside BERT's.
TINY_ARCHITECTURES = {
    "bert": ("wordpiece", {}),
    "roberta": ("bpe", {"type_vocab_size": 1, "pad_token_id": 1, "max_position_embeddings": 130}),
    "xlm-roberta": ("unigram", {"type_vocab_size": 1, "pad_token_id": 1, "max_position_embeddings": 130}),
    "electra": ("wordpiece", {"embedding_size": 16}),
    "distilbert": ("wordpiece", {"type_vocab_size": 0}),
}
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0-4, as RoBERTa and XLM-R


def write_tokenizer(directory: Path, kind: str) -> int:
    """A tokenizer.json of `kind` (wordpiece: vocab.txt instead) in `directory`; returns its size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    if kind == "wordpiece":
        write_tokenizer_files(directory)
        return len(tiny_vocab())
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "bpe":  # RoBERTa's: byte-level, Ġ marks a word's start
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(
            vocab_size=400, special_tokens=ROBERTA_SPECIALS, initial_alphabet=alphabet
        )
        tokenizer.train_from_iterator(CORPUS, trainer)
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    elif kind == "unigram":  # XLM-R's: SentencePiece Unigram, ▁ marks a word's start
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=250, special_tokens=ROBERTA_SPECIALS, unk_token="<unk>")
        tokenizer.train_from_iterator(CORPUS, trainer)
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
    else:
        raise ValueError(f"tokenizer kind must be wordpiece, bpe or unigram, got {kind!r}")
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"model_max_length": 128, "pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tokenizer.get_vocab_size()


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
    task: str,
    directory: Path,
    seed: int = 0,
    labels: list[str] | None = None,
    model_type: str = "bert",
    **overrides,
) -> Path:
    """A random checkpoint for `task` ("classify", "ner", "multiple-choice", "qa", "pretrain") of the
    architecture `model_type` (TINY_ARCHITECTURES), with its kind of tokenizer."""
    import torch

    from model.architectures import head_type
    from model.bert import TASK_HEADS

    directory = Path(directory)
    kind, arch_config = TINY_ARCHITECTURES[model_type]
    vocab_size = write_tokenizer(directory, kind)
    overrides = {"vocab_size": vocab_size, **arch_config, "model_type": model_type, **overrides}
    torch.manual_seed(seed)
    head = TASK_HEADS[task] if task == "pretrain" else head_type(model_type, task)
    model = head(tiny_config(task, labels, **overrides))
    # Random weights with std 0.02 give near-uniform outputs; widen them so tests can
    # tell answers apart.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(directory, tokenizer_from=directory)
    return directory
