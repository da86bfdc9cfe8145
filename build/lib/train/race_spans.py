"""RACE multiple-choice questions turned into extractive QA training examples.

SQuAD's training set is not available offline, and RACE (87k exam questions on passages) is.
Where the right option is a span of the passage, the question becomes a SQuAD-style example:
exactly (case aside), or nearly (token F1 with a passage span of at least `MIN_SPAN_F1`, as
in distant supervision for reading comprehension). A question is kept only when it makes
sense without its options, and when no other option matches as well; wrong options that occur
in the passage verbatim are kept as distractors (RACE's hard negatives) unless the question
is negated ("Who did NOT ..."), whose answer depends on the options.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from processing.metrics import normalize_answer, token_f1

from .examples import DataError, QAExample, json_lines, parse_label

# Questions that only make sense next to their options ("Which of the following is TRUE?").
NEEDS_OPTIONS = re.compile(r"\b(following|title|true|false|mainly|main idea)\b", re.IGNORECASE)
NEGATED = re.compile(r"\b(not|except|never|least)\b|n't\b", re.IGNORECASE)
# Left out when matching a question to the sentence that answers it.
STOPWORDS = frozenset(
    "a an the of to in on at for by with from and or but is are was were be been do does did "
    "what who whom whose which when where why how that this these those it its he she they "
    "his her their we you i".split()
)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
WORD = re.compile(r"\w+(?:'\w+)?")
MIN_SPAN_F1 = 0.8  # a near match must be this close to the option
MARGIN = 0.2  # ... and this much closer than any other option
CONTEXT_WORDS = 120  # about a SQuAD paragraph


def race_span_examples(path: str | Path, context_words: int = CONTEXT_WORDS) -> Iterator[QAExample]:
    for n, row in json_lines(path):
        try:
            article, questions, options = row["article"], row["questions"], row["options"]
            answers = row["answers"]
        except KeyError as e:
            raise DataError(
                path, n, f"missing field {e.args[0]!r} (RACE needs article/questions/options/answers)"
            ) from None
        passage_id = str(row.get("id", n))
        passage = Passage(article)
        for q, (question, choices, answer) in enumerate(zip(questions, options, answers, strict=True)):
            label = parse_label(answer, len(choices), path, n)
            if NEEDS_OPTIONS.search(question):
                continue
            span = answer_span(passage, question, choices, label)
            if span is None:
                continue
            context, start = passage.sentences_around(span, context_words, seed=n * 31 + q)
            text = article[span[0] : span[1]]
            yield QAExample(f"{passage_id}-{q}", question, context, [(text, start)], group=passage_id)


class Passage:
    """A RACE article split once for all its questions: words (lowercased, with their character
    spans) for the span search, and sentences for the contexts."""

    def __init__(self, article: str):
        self.article = article
        matches = list(WORD.finditer(article))
        self.words = [m.group(0).lower() for m in matches]
        self.spans = [m.span() for m in matches]
        self.sentences, begin = [], 0  # (start, end) character bounds
        for end in SENTENCE_END.finditer(article):
            self.sentences.append((begin, end.start()))
            begin = end.end()
        self.sentences.append((begin, len(article)))

    def sentence_of(self, offset: int) -> int:
        """Index of the sentence that holds character `offset` (the last one starting at or before it)."""
        return bisect.bisect_right(self.sentences, offset, key=lambda bounds: bounds[0]) - 1

    def closest_to_question(self, spans: list[tuple[int, int]], question: str) -> tuple[int, int]:
        """The occurrence whose sentence shares most content words with the question (ties: the first)."""
        if len(spans) == 1:
            return spans[0]
        wanted = {w.lower() for w in WORD.findall(question)} - STOPWORDS

        def overlap(span: tuple[int, int]) -> int:
            begin, end = self.sentences[self.sentence_of(span[0])]
            return len(wanted & {w.lower() for w in WORD.findall(self.article[begin:end])})

        return max(spans, key=overlap)

    def sentences_around(self, span: tuple[int, int], words: int, seed: int) -> tuple[str, int]:
        """(context, answer start in it): whole sentences around the span, about `words` long,
        with the answer at a position that varies with `seed`."""
        article, bounds = self.article, self.sentences
        first = last = self.sentence_of(span[0])
        while last + 1 < len(bounds) and bounds[last][1] < span[1]:
            last += 1

        def length(a: int, b: int) -> int:
            return len(article[bounds[a][0] : bounds[b][1]].split())

        before = (words - length(first, last)) * (seed % 5) // 4  # 0..all spare words go first
        while first > 0 and before > 0:
            first -= 1
            before -= length(first, first)
        while last + 1 < len(bounds) and length(first, last) < words:
            last += 1
        begin = bounds[first][0]
        return article[begin : bounds[last][1]], span[0] - begin


def answer_span(passage: Passage, question: str, choices: list[str], label: int) -> tuple[int, int] | None:
    """Character span of the right option in the passage, when it is unambiguous."""
    exact = [option_matches(passage.article, c) for c in choices]
    if exact[label]:
        if NEGATED.search(question) and any(m for i, m in enumerate(exact) if i != label):
            return None
        return passage.closest_to_question(exact[label], question)
    best = [closest_span(passage, c) for c in choices]
    score, span = best[label]
    others = max((s for i, (s, _) in enumerate(best) if i != label), default=0.0)
    if span is None or score < MIN_SPAN_F1 or others > score - MARGIN:
        return None
    return span


def option_matches(article: str, option: str) -> list[tuple[int, int]]:
    """Character spans of every whole-word occurrence of `option` (case aside)."""
    option = option.strip().rstrip(".").strip()
    if len(option) < 2:
        return []
    pattern = r"(?<!\w)" + re.escape(option) + r"(?!\w)"
    return [m.span() for m in re.finditer(pattern, article, re.IGNORECASE)]


def closest_span(passage: Passage, option: str) -> tuple[float, tuple[int, int] | None]:
    """(token F1, character span) of the passage span that best matches `option`.

    Candidates are scored fast by how many of their words occur in the option, for lengths
    near the option's; the best is re-scored with the official SQuAD token F1.
    """
    wanted = normalize_answer(option).split()
    if len(wanted) < 2 or not passage.words:
        return 0.0, None
    vocabulary = set(wanted)
    hits = np.array([w in vocabulary for w in passage.words], dtype=np.int32)
    cumulative = np.concatenate([[0], np.cumsum(hits)])
    best, best_span = 0.0, None
    for length in range(max(1, len(wanted) - 2), len(wanted) + 3):
        if length > len(hits):
            break
        overlap = np.minimum(cumulative[length:] - cumulative[:-length], len(wanted))
        rough = 2 * overlap / (length + len(wanted))
        start = int(np.argmax(rough))
        if rough[start] <= best:
            continue
        first, last = start, start + length - 1
        while first < last and not hits[first]:  # no stray words at the edges
            first += 1
        while last > first and not hits[last]:
            last -= 1
        span = (passage.spans[first][0], passage.spans[last][1])
        score = token_f1(" ".join(passage.words[first : last + 1]), option)
        if score > best:
            best, best_span = score, span
    return best, best_span
