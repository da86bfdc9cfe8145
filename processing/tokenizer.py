"""A thin layer over the fast WordPiece tokenizer, with character offsets.

Texts are tokenized once, without special tokens (`Tokens`); windows and pairs
are then assembled by slicing (`build`). Tokenizing a 50k-character QA context
once and slicing it is what keeps long inputs linear in cost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass
class Tokens:
    """One text, tokenized without special tokens."""

    ids: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n, 2], character spans into the text, end exclusive
    word_ids: np.ndarray  # int64 [n], -1 where the tokenizer gives none

    def __len__(self) -> int:
        return len(self.ids)

    def slice(self, start: int, end: int) -> Tokens:
        return Tokens(self.ids[start:end], self.offsets[start:end], self.word_ids[start:end])


@dataclass
class Encoding:
    """Model input for one sequence: [CLS] first [SEP] (second [SEP])."""

    input_ids: np.ndarray  # int64 [seq]
    token_type_ids: np.ndarray  # int64 [seq]
    offsets: np.ndarray  # int64 [seq, 2]; (0, 0) for special tokens
    sequence_ids: np.ndarray  # int64 [seq]; 0 first text, 1 second, -1 special
    word_ids: np.ndarray  # int64 [seq]; -1 for special tokens
    truncated: bool = False  # encode() cut tokens to fit max_length

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def attention_mask(self) -> np.ndarray:
        return np.ones_like(self.input_ids)


@dataclass
class TokenSpan:
    """One token as /tokenize shows it (TEI's shape): `text` is the input's text[start:stop], or for a
    token the tokenizer added ([CLS], [SEP]) its name, with no offsets."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


# BERT's special tokens; tokenizer_config.json names others (MPNet: <s> </s> <pad>, whose vocabulary
# also holds unused [CLS] / [SEP] entries, so the names must come from the config, not the vocabulary).
BERT_SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"}


def special_tokens(config: dict) -> dict[str, str]:
    """The special tokens tokenizer_config.json names (`cls_token` ...: a string or {"content": ...})."""
    out = dict(BERT_SPECIALS)
    for role in out:
        value = config.get(f"{role}_token")
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[role] = value
    return out


class TextTokenizer:
    def __init__(
        self, tokenizer: Tokenizer, do_lower_case: bool = True, specials: dict[str, str] | None = None
    ):
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.do_lower_case = do_lower_case
        vocab = tokenizer.get_vocab()
        specials = specials or BERT_SPECIALS
        missing = [specials[r] for r in ("cls", "sep", "pad", "unk") if specials[r] not in vocab]
        if missing:
            raise ValueError(f"vocabulary lacks special tokens {missing}")
        self.cls_id, self.sep_id = vocab[specials["cls"]], vocab[specials["sep"]]
        self.pad_id, self.unk_id = vocab[specials["pad"]], vocab[specials["unk"]]
        self.mask_id = vocab.get(specials["mask"], self.unk_id)
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def from_dir(cls, directory: str | Path) -> TextTokenizer:
        directory = Path(directory)
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
        lower = bool(config.get("do_lower_case", True))
        if (directory / "tokenizer.json").exists():
            return cls(Tokenizer.from_file(str(directory / "tokenizer.json")), lower, special_tokens(config))
        if (directory / "vocab.txt").exists():
            wordpiece = BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=lower)
            return cls(wordpiece._tokenizer, lower)
        raise FileNotFoundError(f"no tokenizer.json or vocab.txt in {directory}")

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(directory / "tokenizer.json"))
        config = {"do_lower_case": self.do_lower_case, "tokenizer_class": "BertTokenizer"}
        (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")

    # ------------------------------------------------------------------ tokenizing

    @staticmethod
    def _to_tokens(enc) -> Tokens:
        n = len(enc.ids)
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(n, 2)
        word_ids = np.asarray([-1 if w is None else w for w in enc.word_ids], dtype=np.int64)
        return Tokens(np.asarray(enc.ids, dtype=np.int64), offsets, word_ids)

    def tokenize(self, text: str) -> Tokens:
        return self._to_tokens(self.tokenizer.encode(text, add_special_tokens=False))

    def tokenize_batch(self, texts: list[str]) -> list[Tokens]:
        encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [self._to_tokens(e) for e in encs]

    def tokenize_words(self, words: list[str]) -> Tokens:
        """Pre-split words (CoNLL); word_ids index `words`, offsets are within each word."""
        return self._to_tokens(self.tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False))

    def tokenize_spans(self, text: str, spans: list[tuple[int, int]]) -> Tokens:
        """`text` cut into the given [start, end) words; word_ids index `spans`, offsets are
        into `text`."""
        if not spans:
            return self.tokenize("")
        tokens = self.tokenize_words([text[s:e] for s, e in spans])
        starts = np.asarray([s for s, _ in spans], dtype=np.int64)
        # Offsets come back within each word: shift them by the word's start in the text.
        shift = np.where(tokens.word_ids >= 0, starts[np.maximum(tokens.word_ids, 0)], 0)
        tokens.offsets = tokens.offsets + shift[:, None]
        return tokens

    def token_spans(self, text: str, add_special_tokens: bool = True) -> list[TokenSpan]:
        """The tokens the model reads for `text` alone (build's [CLS] text [SEP]), with offsets."""
        tokens = self.tokenize(text)
        ids, offsets, special = tokens.ids, tokens.offsets, np.zeros(len(tokens), dtype=bool)
        if add_special_tokens:
            encoding = self.build(tokens)
            ids, offsets, special = encoding.input_ids, encoding.offsets, encoding.sequence_ids < 0
        return [
            TokenSpan(int(i), self.tokenizer.id_to_token(int(i)), True, None, None)
            if added
            else TokenSpan(int(i), text[start:stop], False, int(start), int(stop))
            for i, (start, stop), added in zip(ids, offsets, special, strict=True)
        ]

    # ------------------------------------------------------------------ assembling

    def build(self, first: Tokens, second: Tokens | None = None) -> Encoding:
        parts_ids = [[self.cls_id], first.ids, [self.sep_id]]
        n_first = len(first) + 2
        n_second = len(second) + 1 if second is not None else 0
        special = np.zeros((1, 2), dtype=np.int64)
        offsets = [special, first.offsets, special]
        seq_ids = [[-1], np.zeros(len(first), np.int64), [-1]]
        word_ids = [[-1], first.word_ids, [-1]]
        if second is not None:
            parts_ids += [second.ids, [self.sep_id]]
            offsets += [second.offsets, special]
            seq_ids += [np.ones(len(second), np.int64), [-1]]
            word_ids += [second.word_ids, [-1]]
        token_type = np.concatenate([np.zeros(n_first, np.int64), np.ones(n_second, np.int64)])
        return Encoding(
            input_ids=np.concatenate(parts_ids).astype(np.int64),
            token_type_ids=token_type,
            offsets=np.concatenate(offsets).astype(np.int64),
            sequence_ids=np.concatenate(seq_ids).astype(np.int64),
            word_ids=np.concatenate(word_ids).astype(np.int64),
        )

    def encode(self, text: str, text_pair: str | None = None, max_length: int = 512) -> Encoding:
        """Encode one text or a pair, truncating the longer side first to fit `max_length`."""
        first = self.tokenize(text)
        second = self.tokenize(text_pair) if text_pair is not None else None
        n_tokens = len(first) + (len(second) if second is not None else 0)
        first, second = truncate_pair(first, second, max_length)
        encoding = self.build(first, second)
        encoding.truncated = len(first) + (len(second) if second is not None else 0) < n_tokens
        return encoding


def truncate_pair(first: Tokens, second: Tokens | None, max_length: int) -> tuple[Tokens, Tokens | None]:
    """Longest-first truncation, so the pair plus its special tokens fits `max_length`."""
    specials = 3 if second is not None else 2
    budget = max_length - specials
    if budget < 1:
        raise ValueError(f"max_length {max_length} leaves no room for text")
    n1, n2 = len(first), len(second) if second is not None else 0
    while n1 + n2 > budget:
        if n1 >= n2:
            n1 -= 1
        else:
            n2 -= 1
    first = first.slice(0, n1)
    return first, (second.slice(0, n2) if second is not None else None)


def default_window_overlap(max_seq_len: int) -> int:
    """Tokens shared by neighbouring NER/classify windows where a model records none: 32, at most a
    quarter of the window (training's default, and serving's for bundles that predate the record)."""
    return min(32, (max_seq_len - 2) // 4)


def window_spans(n_tokens: int, capacity: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) token spans of at most `capacity`, consecutive spans sharing `overlap` tokens."""
    if capacity < 1:
        raise ValueError(f"window capacity must be positive, got {capacity}")
    if not 0 <= overlap < capacity:
        raise ValueError(
            f"overlap/stride {overlap} must be >= 0 and smaller than the window ({capacity} tokens)"
        )
    if n_tokens <= capacity:
        return [(0, n_tokens)]
    spans, start, step = [], 0, capacity - overlap
    while True:
        end = min(start + capacity, n_tokens)
        spans.append((start, end))
        if end == n_tokens:
            return spans
        start += step
