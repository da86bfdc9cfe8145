"""SQuAD paragraphs as sentence ranking, the way GLUE's QNLI was built from SQuAD.

Each question is paired with every sentence of its paragraph: the sentence holding the answer is
`relevant`, the others `not_relevant`. A question is dropped when its label is not clear: its
(first) answer crosses a sentence boundary, or another annotator's answer starts in a different
sentence. The reranker default trains on these pairs (`python -m train --task classify --format
squad-sentences`) and `benchmarks/rerank_quality.py` ranks the same sentences.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .examples import ClassifyExample, QAExample

LABELS = ("not_relevant", "relevant")  # id order: the positive class is label index 1
# A sentence ends at . ! or ? (closing quotes and brackets included) before whitespace and a
# capital letter, digit, quote or bracket, unless the word before the stop is an abbreviation.
BOUNDARY = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s+[\"'\u201c\u2018(\[]?[A-Z0-9])")
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc inc ltd co corp no nos vol fig approx ca c gen col lt sgt "
    "capt rev gov sen rep jan feb mar apr jun jul aug sep sept oct nov dec mt ft e.g i.e u.s u.k "
    "a.d b.c d.c".split()
)


def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of `text`, whitespace between them left out.
    Deterministic and rule-based: an abbreviation ("Dr.", "e.g.", "U.S.") or an initial ("J. R.")
    before the stop does not end a sentence."""
    spans, start = [], 0
    for m in BOUNDARY.finditer(text):
        words = text[start : m.start()].split()
        word = words[-1].lstrip("\"'(\u201c[") if words else ""
        if m.group().startswith(".") and (word.lower() in ABBREVIATIONS or re.fullmatch(r"[A-Z]", word)):
            continue
        end = m.end()
        if text[start:end].strip():
            spans.append(trim(text, start, end))
        start = end
    if text[start:].strip():
        spans.append(trim(text, start, len(text)))
    return spans


def trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


@dataclass
class RankingQuestion:
    id: str
    question: str
    sentences: list[str]
    relevant: int  # index into sentences
    group: str  # the article title


def sentence_of(spans: list[tuple[int, int]], start: int, end: int) -> int | None:
    """The sentence holding the characters [start, end), or None when they cross a boundary."""
    for i, (_, e) in enumerate(spans):
        if start < e:
            return i if end <= e else None
    return None


def ranking_questions(examples: Iterable[QAExample], stats: dict | None = None) -> Iterator[RankingQuestion]:
    """Every SQuAD question (`train.readers.read_squad`) whose answer lies in one sentence of a
    paragraph of two or more; `stats` (if given) counts the kept and dropped questions."""
    stats = stats if stats is not None else {}
    for key in ("kept", "crosses_sentences", "answers_disagree", "one_sentence"):
        stats.setdefault(key, 0)
    for e in examples:
        if not e.answers:  # SQuAD 2.0's unanswerable questions have no relevant sentence
            continue
        spans = split_sentences(e.context)
        if len(spans) < 2:
            stats["one_sentence"] += 1
            continue
        text, start = e.answers[0]
        first = sentence_of(spans, start, start + len(text))
        if first is None:
            stats["crosses_sentences"] += 1
            continue
        if any(sentence_of(spans, s, s + 1) != first for _, s in e.answers[1:]):
            stats["answers_disagree"] += 1
            continue
        stats["kept"] += 1
        yield RankingQuestion(e.id, e.question, [e.context[s:t] for s, t in spans], first, e.group)


def sentence_pairs(questions: list[RankingQuestion]) -> list[ClassifyExample]:
    """(question, sentence) pairs labelled relevant / not_relevant, grouped by article."""
    return [
        ClassifyExample(q.question, sentence, LABELS[i == q.relevant], q.group)
        for q in questions
        for i, sentence in enumerate(q.sentences)
    ]


def sample_negatives(examples: list[ClassifyExample], negatives: int, seed: int) -> list[ClassifyExample]:
    """Every relevant pair and at most `negatives` not-relevant ones per question (seeded): fewer
    pairs per question lets a CPU budget cover more questions."""
    rng = random.Random(seed)
    by_question: dict[tuple[str, str], list[int]] = {}
    for i, e in enumerate(examples):
        if e.label == LABELS[0]:
            by_question.setdefault((e.group, e.text), []).append(i)
    drop = set()
    for indices in by_question.values():
        rng.shuffle(indices)
        drop.update(indices[negatives:])
    return [e for i, e in enumerate(examples) if i not in drop]
