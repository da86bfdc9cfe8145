"""Multiple choice (SWAG/CODAH/RACE style): pack each choice with its context."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .padding import softmax
from .tokenizer import Encoding, TextTokenizer, Tokens

BLANK = "_"


@dataclass
class ChoiceResult:
    best: int
    choice: str
    scores: list[float]


def choice_second_segment(question: str | None, choice: str) -> str:
    """RACE cloze questions ("... _ ...") get the option filled in; others are question + option."""
    if not question:
        return choice
    if BLANK in question:
        return question.replace(BLANK, choice, 1)
    return f"{question} {choice}"


def encode_choices(
    tokenizer: TextTokenizer,
    context: str,
    question: str | None,
    choices: list[str],
    max_seq_len: int = 128,
) -> list[Encoding]:
    """[CLS] context [SEP] question+choice [SEP] (or the tokenizer's pair layout) per choice; the
    context is cut first (it is shared)."""
    context_tokens = tokenizer.tokenize(context)
    seconds = tokenizer.tokenize_batch([choice_second_segment(question, c) for c in choices])
    return [pack_choice(tokenizer, context_tokens, second, max_seq_len) for second in seconds]


def pack_choice(tokenizer: TextTokenizer, context: Tokens, second: Tokens, max_seq_len: int) -> Encoding:
    budget = max_seq_len - tokenizer.n_special(pair=True)
    # Keep at least half the room for the context when the choice is long.
    second = second.slice(0, min(len(second), max(budget // 2, budget - len(context))))
    context = context.slice(0, budget - len(second))
    return tokenizer.build(context, second)


def choice_from_logits(logits: np.ndarray, choices: list[str]) -> ChoiceResult:
    probs = softmax(np.asarray(logits, dtype=np.float64).reshape(-1))
    best = int(np.argmax(probs))
    return ChoiceResult(best=best, choice=choices[best], scores=[float(p) for p in probs])
