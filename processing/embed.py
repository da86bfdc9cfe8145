"""Sentence embeddings: long inputs, window pooling, normalization, cosine scores, wire encodings.

The graph pools each sequence's token states into one vector (the bundle's `pooling.mode`, as
sentence-transformers' Pooling module does). What is left for here: an input longer than the
model's window follows the classification rule (processing.classify: truncate, or overlapping
windows), and the windows' vectors are pooled again by the same rule, each weighted by the tokens
it read; then L2 normalization, if asked for.
"""

from __future__ import annotations

import base64

import numpy as np

from .classify import encode_for_classify
from .tokenizer import Encoding, TextTokenizer

POOLING_MODES = ("mean", "cls", "max", "lasttoken")  # as sentence-transformers' Pooling names them
# A sentence-transformers Dense module's activation (export.sentence_encoder.DENSE_ACTIVATIONS).
DENSE_ACTIVATIONS = {
    "identity": lambda x: x,
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}
TRUNCATION_SIDES = ("right", "left")
NORM_EPS = 1e-12  # torch.nn.functional.normalize's, which sentence-transformers' Normalize uses


def encode_for_embed(
    tokenizer: TextTokenizer,
    text: str,
    max_seq_len: int,
    long_text: str = "truncate",
    window_overlap: int = 32,
    side: str = "right",
) -> list[Encoding]:
    """One encoding (cut to `max_seq_len`, keeping the end of the text when `side` is "left"), or
    with long_text="windows" one per overlapping window, as classification does."""
    if side == "right" or long_text == "windows":
        return encode_for_classify(tokenizer, text, None, max_seq_len, long_text, window_overlap)
    if side != "left":
        raise ValueError(f"truncation side must be one of {TRUNCATION_SIDES}, got {side!r}")
    tokens = tokenizer.tokenize(text)
    keep = max_seq_len - tokenizer.n_special()
    encoding = tokenizer.build(tokens.slice(max(0, len(tokens) - keep), len(tokens)))
    encoding.truncated = len(tokens) > keep
    return [encoding]


def pool_tokens(states: np.ndarray, mode: str) -> np.ndarray:
    """[tokens, hidden] states of one sequence's real tokens -> [hidden], as sentence-transformers'
    Pooling does: their mean, the first ([CLS]) one, the per-channel maximum, or the last one.
    Pooled over the row's own tokens, a vector cannot depend on the padding its batch gave it."""
    if mode == "mean":
        return states.mean(axis=0, dtype=np.float32)
    if mode == "cls":
        return states[0]
    if mode == "max":
        return states.max(axis=0)
    if mode == "lasttoken":
        return states[-1]
    raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")


def pool_windows(vectors: np.ndarray, lengths: list[int], mode: str) -> np.ndarray:
    """[windows, hidden] -> [hidden]: one window as it is; several by the pooling rule, mean and
    cls weighted by each window's tokens (a mean over all the tokens read, overlaps counted twice),
    max as the maximum."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if len(vectors) == 1:
        return vectors[0]
    if mode == "max":
        return vectors.max(axis=0)
    if mode == "lasttoken":  # the text's last token is the last window's
        return vectors[-1]
    if mode not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")
    weights = np.asarray(lengths, dtype=np.float32)[:, None]
    return (vectors * weights).sum(axis=0) / weights.sum()


def apply_dense(vectors: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray | None, str]]) -> np.ndarray:
    """sentence-transformers' Dense modules on pooled [..., in] vectors: activation(x W^T + b), in order."""
    x = np.asarray(vectors, dtype=np.float32)
    for weight, bias, activation in layers:
        x = x @ weight.T
        if bias is not None:
            x = x + bias
        x = DENSE_ACTIVATIONS[activation](x).astype(np.float32)
    return x


def normalize(vectors: np.ndarray) -> np.ndarray:
    """L2-normalize the last axis, as torch.nn.functional.normalize (p=2, eps=1e-12)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, NORM_EPS)


def cosine_scores(source: np.ndarray, others: np.ndarray) -> list[float]:
    """Cosine similarity of `source` [hidden] with each row of `others` [n, hidden]."""
    return (normalize(others) @ normalize(source)).astype(float).tolist()


def to_base64(vector: np.ndarray) -> str:
    """OpenAI's encoding_format "base64": the float32 values, little-endian, base64-encoded."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def from_base64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")
