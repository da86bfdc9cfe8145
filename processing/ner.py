"""Token classification: label alignment for training, windows for long texts, and
entity aggregation from tokenizer offsets (never from `##` heuristics).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .padding import softmax
from .tokenizer import Encoding, TextTokenizer, Tokens, window_spans
from .words import split_words

STRATEGIES = ("none", "simple", "first", "average", "max")
IGNORE = -100


@dataclass
class Entity:
    entity: str
    text: str
    start: int
    end: int
    score: float


def align_labels(word_ids: np.ndarray, word_labels: list[int]) -> np.ndarray:
    """The word's label on its first sub-token; every other sub-token and specials get -100."""
    labels = np.full(len(word_ids), IGNORE, dtype=np.int64)
    previous = -1
    for i, w in enumerate(word_ids):
        if w >= 0 and w != previous:
            labels[i] = word_labels[w]
        previous = w
    return labels


def split_label(label: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '')."""
    if label == "O" or "-" not in label:
        return "O", ""
    prefix, kind = label.split("-", 1)
    return prefix, kind


def tokenize_text(tokenizer: TextTokenizer, text: str, word_split: str) -> Tokens:
    """Raw text as the model's words (the rule it was trained with, processing.words), with
    word_ids over those words and offsets into `text`."""
    if word_split == "bert" and tokenizer.model_kind == "WordPiece":
        return tokenizer.tokenize(text)  # BERT's own words, as it was trained on them
    return tokenizer.tokenize_spans(text, split_words(text, word_split))


# ----------------------------------------------------------------------------- windows


@dataclass
class NERWindow:
    encoding: Encoding
    token_start: int
    n_tokens: int
    offset: int = 1  # where the text's tokens start in the encoding (after [CLS] / <s>)


def make_windows(tokenizer: TextTokenizer, tokens: Tokens, max_seq_len: int, overlap: int) -> list[NERWindow]:
    spans = window_spans(len(tokens), max_seq_len - tokenizer.n_special(), overlap)
    offset = tokenizer.single.before(0)
    return [NERWindow(tokenizer.build(tokens.slice(s, e)), s, e - s, offset) for s, e in spans]


def merge_window_logits(n_tokens: int, windows: list[NERWindow], logits: list[np.ndarray]) -> np.ndarray:
    """[n_tokens, labels] logits, each token taken from the window where it sits farthest from an edge."""
    n_labels = logits[0].shape[-1]
    merged = np.zeros((n_tokens, n_labels), dtype=np.float64)
    best_margin = np.full(n_tokens, -1)
    for window, window_logits in zip(windows, logits, strict=True):
        idx = np.arange(window.n_tokens)
        margin = np.minimum(idx, window.n_tokens - 1 - idx)
        positions = window.token_start + idx
        better = margin > best_margin[positions]
        merged[positions[better]] = window_logits[window.offset : window.offset + window.n_tokens][better]
        best_margin[positions[better]] = margin[better]
    return merged


# ----------------------------------------------------------------------------- aggregation


def word_predictions(
    word_ids: np.ndarray, logits: np.ndarray, strategy: str = "first"
) -> dict[int, np.ndarray]:
    """Per-word label probabilities from sub-token logits: first sub-token, average, or max."""
    probs = softmax(logits, axis=-1)
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(word_ids):
        if w >= 0:
            groups.setdefault(int(w), []).append(i)
    out = {}
    for w, idx in groups.items():
        if strategy == "first":
            out[w] = probs[idx[0]]
        elif strategy == "average":
            out[w] = probs[idx].mean(axis=0)
        elif strategy == "max":
            out[w] = probs[idx[int(np.argmax(probs[idx].max(axis=1)))]]
        else:
            raise ValueError(f"unknown word strategy {strategy!r}")
    return out


def aggregate_entities(
    text: str, tokens: Tokens, logits: np.ndarray, id2label: dict[int, str], strategy: str = "first"
) -> list[Entity]:
    """Entities with character spans into `text` (end exclusive), from per-token logits."""
    if strategy not in STRATEGIES:
        raise ValueError(f"aggregation must be one of {STRATEGIES}, got {strategy!r}")
    if len(tokens) == 0:
        return []
    if strategy in ("none", "simple"):
        probs = softmax(logits, axis=-1)
        # A lone word-start piece (Ġ, ▁) holds no character: it is no entity on its own.
        units = [(int(s), int(e), probs[i]) for i, (s, e) in enumerate(tokens.offsets.tolist()) if s < e]
    else:
        per_word = word_predictions(tokens.word_ids, logits, strategy)
        units = []
        for w, p in sorted(per_word.items()):
            idx = np.nonzero(tokens.word_ids == w)[0]
            units.append((int(tokens.offsets[idx[0], 0]), int(tokens.offsets[idx[-1], 1]), p))
    labelled = []
    for start, end, p in units:
        k = int(np.argmax(p))
        labelled.append((start, end, id2label[k], float(p[k])))
    if strategy == "none":
        return [Entity(lab, text[s:e], s, e, sc) for s, e, lab, sc in labelled if lab != "O"]
    return group_entities(text, labelled)


def group_entities(text: str, labelled: list[tuple[int, int, str, float]]) -> list[Entity]:
    """Join consecutive units of one type. B- always opens an entity; an I- after another type opens
    one too, which reads IOB1 and IOB2 alike."""
    entities: list[Entity] = []
    current: tuple[str, int, int, list[float]] | None = None

    def close() -> None:
        if current is not None:
            kind, s, e, scores = current
            entities.append(Entity(kind, text[s:e], s, e, float(np.mean(scores))))

    for start, end, label, score in labelled:
        prefix, kind = split_label(label)
        if prefix == "O":
            close()
            current = None
        elif current is not None and prefix != "B" and kind == current[0]:
            current = (kind, current[1], end, current[3] + [score])
        else:
            close()
            current = (kind, start, end, [score])
    close()
    return entities
