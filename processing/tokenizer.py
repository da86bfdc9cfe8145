"""A thin layer over a `tokenizers` tokenizer (WordPiece, byte-level BPE or Unigram), with character
offsets.

Texts are tokenized once, without special tokens (`Tokens`); windows and pairs
are then assembled by slicing (`build`). Tokenizing a 50k-character QA context
once and slicing it is what keeps long inputs linear in cost.

Where the special tokens go is read from the tokenizer's own post-processor (`Layout`): BERT's
[CLS] A [SEP] B [SEP] with B typed 1, RoBERTa's and XLM-R's <s> A </s></s> B </s> with one type.
Offsets never cover whitespace: byte-level BPE and SentencePiece mark a word's start with a piece
(Ġ, ▁) that can stand alone over the space before it, and such a piece gets an empty offset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers
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


@dataclass(frozen=True)
class Specials:
    """A run of special tokens the post-processor adds, with their token types."""

    ids: tuple[int, ...]
    types: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """One text or a pair as the model reads it: `parts` in order, each a run of special tokens or
    the index of a text (0 first, 1 second); `types[i]` is text i's token type."""

    parts: tuple[Specials | int, ...]
    types: tuple[int, ...]

    def before(self, text: int) -> int:
        """Tokens ahead of text `text` other than the texts before it (QA's context offset)."""
        n = 0
        for part in self.parts:
            if part == text:
                return n
            n += len(part.ids) if isinstance(part, Specials) else 0
        raise ValueError(f"the layout has no text {text}")

    @property
    def n_special(self) -> int:
        return sum(len(p.ids) for p in self.parts if isinstance(p, Specials))

    @classmethod
    def read(cls, encoding) -> Layout:
        """The layout an encoding of one or two texts, special tokens added, shows."""
        parts: list[Specials | int] = []
        types: dict[int, int] = {}
        rows = zip(encoding.ids, encoding.type_ids, encoding.sequence_ids, strict=True)
        for token_id, type_id, seq in rows:
            if seq is not None:
                types[seq] = type_id
                if not parts or parts[-1] != seq:
                    parts.append(seq)
            elif parts and isinstance(parts[-1], Specials):
                parts[-1] = Specials(parts[-1].ids + (token_id,), parts[-1].types + (type_id,))
            else:
                parts.append(Specials((token_id,), (type_id,)))
        return cls(tuple(parts), tuple(types[i] for i in sorted(types)))


PAD_TOKENS, UNK_TOKENS, MASK_TOKENS = ("[PAD]", "<pad>"), ("[UNK]", "<unk>"), ("[MASK]", "<mask>")
# Code points str.isspace() calls whitespace (none above U+3000): offsets are trimmed of them. A
# lookup table, since np.isin sorts on every call (0.2 ms a text).
_IS_SPACE = np.array([chr(c).isspace() for c in range(0x3101)], dtype=bool)


def special_tokens(config: dict) -> dict[str, str]:
    """The special tokens tokenizer_config.json names (`pad_token` ...: a string or {"content": ...}).
    They outrank the spelling lists: MPNet's vocabulary holds unused [PAD]/[UNK] beside its <pad>/<unk>."""
    out = {}
    for role in ("pad", "unk", "mask"):
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
        named = specials or {}

        def find(role: str, spellings: tuple[str, ...]) -> int | None:
            if named.get(role) in vocab:
                return vocab[named[role]]
            return next((vocab[t] for t in spellings if t in vocab), None)

        pad, unk = find("pad", PAD_TOKENS), find("unk", UNK_TOKENS)
        if pad is None or unk is None:
            raise ValueError(f"vocabulary lacks a padding or unknown token ({PAD_TOKENS}, {UNK_TOKENS})")
        self.pad_id, self.unk_id = pad, unk
        mask = find("mask", MASK_TOKENS)
        self.mask_id = unk if mask is None else mask
        self.vocab_size = tokenizer.get_vocab_size()
        self.single, self.pair = self._layouts(tokenizer, vocab)
        self.cls_id = self.single.parts[0].ids[0]  # BERT pretraining builds its own pairs from these
        self.sep_id = self.single.parts[-1].ids[-1]
        self.model_kind = type(tokenizer.model).__name__  # WordPiece, BPE, Unigram
        # Words given apart (tokenize_words) each start a word, as they do mid-sentence: a byte-level
        # BPE tokenizer adds the space (Ġ) its pre-tokenizer would otherwise leave off.
        self.word_tokenizer = _with_prefix_space(tokenizer)

    @staticmethod
    def _layouts(tokenizer: Tokenizer, vocab: dict[str, int]) -> tuple[Layout, Layout]:
        if tokenizer.post_processor is None:  # a bare tokenizer.json: BERT's layout, by name
            if "[CLS]" not in vocab or "[SEP]" not in vocab:
                raise ValueError("tokenizer.json has no post_processor, and no [CLS] / [SEP] to build BERT's")
            cls_, sep = Specials((vocab["[CLS]"],), (0,)), vocab["[SEP]"]
            return Layout((cls_, 0, Specials((sep,), (0,))), (0,)), Layout(
                (cls_, 0, Specials((sep,), (0,)), 1, Specials((sep,), (1,))), (0, 1)
            )
        single = Layout.read(tokenizer.encode("a", add_special_tokens=True))
        pair = Layout.read(tokenizer.encode("a", "b", add_special_tokens=True))
        if not all(isinstance(single.parts[i], Specials) for i in (0, -1)):
            raise ValueError("the tokenizer's post_processor does not put special tokens around a text")
        return single, pair

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
    def _to_tokens(enc, text: str | None = None) -> Tokens:
        n = len(enc.ids)
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(n, 2)
        if text is not None:
            offsets = trim_whitespace(offsets, text)
        word_ids = np.asarray([-1 if w is None else w for w in enc.word_ids], dtype=np.int64)
        return Tokens(np.asarray(enc.ids, dtype=np.int64), offsets, word_ids)

    def _trims(self, text: str) -> str | None:
        # WordPiece offsets never cover whitespace; BPE's and Unigram's word-start pieces may.
        return None if self.model_kind == "WordPiece" else text

    def tokenize(self, text: str) -> Tokens:
        return self._to_tokens(self.tokenizer.encode(text, add_special_tokens=False), self._trims(text))

    def tokenize_batch(self, texts: list[str]) -> list[Tokens]:
        encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [self._to_tokens(e, self._trims(t)) for e, t in zip(encs, texts, strict=True)]

    def tokenize_words(self, words: list[str]) -> Tokens:
        """Pre-split words (CoNLL); word_ids index `words`, offsets are within each word (a word-start
        piece with no character of its own, Ġ, sits empty at the word's start)."""
        enc = self.word_tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
        tokens = self._to_tokens(enc)
        empty = tokens.offsets[:, 0] >= tokens.offsets[:, 1]
        tokens.offsets[empty] = 0
        return tokens

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

    def decode(self, sequences: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Each sequence of ids back to text, by the tokenizer's own decoder (ids < vocab_size)."""
        return self.tokenizer.decode_batch(sequences, skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ assembling

    def layout(self, pair: bool) -> Layout:
        return self.pair if pair else self.single

    def n_special(self, pair: bool = False) -> int:
        """Special tokens around one text (2 for all we know) or a pair (BERT 3, RoBERTa 4)."""
        return self.layout(pair).n_special

    def build(self, first: Tokens, second: Tokens | None = None) -> Encoding:
        """The model's input for one text or a pair, special tokens where the layout puts them."""
        layout = self.layout(second is not None)
        texts = (first, second)
        ids, types, offsets, seq_ids, word_ids = [], [], [], [], []
        for part in layout.parts:
            if isinstance(part, Specials):
                n = len(part.ids)
                ids.append(part.ids)
                types.append(part.types)
                offsets.append(np.zeros((n, 2), np.int64))
                seq_ids.append(np.full(n, -1))
                word_ids.append(np.full(n, -1))
            else:
                tokens = texts[part]
                ids.append(tokens.ids)
                types.append(np.full(len(tokens), layout.types[part]))
                offsets.append(tokens.offsets)
                seq_ids.append(np.full(len(tokens), part))
                word_ids.append(tokens.word_ids)
        return Encoding(
            input_ids=np.concatenate(ids).astype(np.int64),
            token_type_ids=np.concatenate(types).astype(np.int64),
            offsets=np.concatenate(offsets).astype(np.int64),
            sequence_ids=np.concatenate(seq_ids).astype(np.int64),
            word_ids=np.concatenate(word_ids).astype(np.int64),
        )

    def encode(self, text: str, text_pair: str | None = None, max_length: int = 512) -> Encoding:
        """Encode one text or a pair, truncating the longer side first to fit `max_length`."""
        first = self.tokenize(text)
        second = self.tokenize(text_pair) if text_pair is not None else None
        n_tokens = len(first) + (len(second) if second is not None else 0)
        first, second = truncate_pair(first, second, max_length, self.n_special(second is not None))
        encoding = self.build(first, second)
        encoding.truncated = len(first) + (len(second) if second is not None else 0) < n_tokens
        return encoding


def truncate_pair(
    first: Tokens, second: Tokens | None, max_length: int, specials: int | None = None
) -> tuple[Tokens, Tokens | None]:
    """Longest-first truncation, so the pair plus its `specials` (BERT's 2 or 3) fits `max_length`."""
    specials = specials if specials is not None else (3 if second is not None else 2)
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


def trim_whitespace(offsets: np.ndarray, text: str) -> np.ndarray:
    """[n, 2] character offsets shrunk off any whitespace at either end; a token over whitespace
    only (a lone Ġ or ▁) becomes empty where the next character is."""
    if len(offsets) == 0:
        return offsets
    chars = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # one per str index
    space = _IS_SPACE[np.minimum(chars, 0x3100)]
    if not space.any():
        return offsets  # nothing to trim (most Chinese text)
    solid = np.flatnonzero(~space)  # indices of non-whitespace characters
    if len(solid) == 0:  # whitespace only: every token empty at its end
        return np.stack([offsets[:, 1], offsets[:, 1]], axis=1)
    starts, ends = offsets[:, 0], offsets[:, 1]
    i = np.searchsorted(solid, starts)  # the first solid character at or after each start
    first = np.where(i < len(solid), solid[np.minimum(i, len(solid) - 1)], len(text))
    new_starts = np.minimum(first, ends)
    j = np.searchsorted(solid, ends) - 1  # the last solid character before each end
    last = np.where(j >= 0, solid[np.maximum(j, 0)] + 1, 0)
    new_ends = np.maximum(last, new_starts)
    return np.stack([new_starts, new_ends], axis=1)


def _with_prefix_space(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer`, or for a byte-level pre-tokenizer without add_prefix_space a copy with it (read
    off the object: serializing a 250k-piece vocabulary to look would cost a second per load)."""
    pre = tokenizer.pre_tokenizer
    if not isinstance(pre, pre_tokenizers.ByteLevel) or pre.add_prefix_space:
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=True, trim_offsets=pre.trim_offsets, use_regex=pre.use_regex
    )
    return copy


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
