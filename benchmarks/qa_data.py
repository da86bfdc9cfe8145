"""SQuAD helpers for qa_vs_pipeline: held-out article selection, long contexts, answer agreement.

Pure functions (no model, no torch) so the tests can check them exactly.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

from processing.metrics import normalize_answer, token_f1


def select_articles(examples: list, spec: str) -> tuple[list, str]:
    """The examples of the articles `spec` names, and a description of the choice."""
    titles = list(dict.fromkeys(e.group for e in examples))
    kind, _, rest = spec.partition(":")
    if spec == "all":
        chosen = titles
    elif kind == "trainer":
        fraction, _, seed = rest.partition(":")
        from train.splits import split_by_group

        held = split_by_group(examples, float(fraction or 0.15), int(seed or 42))[1]
        chosen = list(dict.fromkeys(e.group for e in held))
    elif kind == "last":
        count = math.ceil(float(rest or 0.15) * len(titles))
        chosen = titles[len(titles) - count :]
    else:
        chosen = []
        for item in (x.strip() for x in spec.split(",") if x.strip()):
            if item.isdigit() and int(item) < len(titles):
                chosen.append(titles[int(item)])
            elif item in titles:
                chosen.append(item)
            else:
                raise SystemExit(
                    f"--articles: {item!r} is neither an article index (< {len(titles)}) nor a title"
                )
    keep = set(chosen)
    return [
        e for e in examples if e.group in keep
    ], f"{spec}: {len(chosen)} of {len(titles)} articles {chosen}"


def agreement(ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How often two systems give the same answer to the same questions."""
    if set(ours) != set(theirs):
        raise ValueError(
            f"answer sets differ: {len(set(ours) ^ set(theirs))} question ids in only one of them"
        )
    n = len(ours)
    same_span = sum(
        (ours[q]["start"], ours[q]["end"]) == (theirs[q]["start"], theirs[q]["end"]) for q in ours
    )
    same_text = sum(normalize_answer(ours[q]["text"]) == normalize_answer(theirs[q]["text"]) for q in ours)
    overlap = [token_f1(ours[q]["text"], theirs[q]["text"]) for q in ours]
    differing = [q for q in ours if normalize_answer(ours[q]["text"]) != normalize_answer(theirs[q]["text"])]
    return {
        "questions": n,
        "same_span": same_span,
        "same_normalized_text": same_text,
        "same_span_rate": round(same_span / n, 4) if n else None,
        "same_text_rate": round(same_text / n, 4) if n else None,
        "mean_token_f1_between": round(statistics.fmean(overlap), 4) if n else None,
        "examples_of_differences": [
            {"id": q, "ours": ours[q]["text"], "theirs": theirs[q]["text"]} for q in differing[:10]
        ],
    }


def build_long_context(
    paragraph: str, fillers: list[str], target: int, rng: random.Random
) -> tuple[str, int]:
    """About `target` characters: other paragraphs around `paragraph` (at a random slot).

    Returns the context and where `paragraph` starts in it; the length is exactly `target` unless
    the paragraph alone is longer.
    """
    budget = target - len(paragraph)
    if budget <= 1:
        return paragraph, 0
    pool = [f for f in fillers if f != paragraph]
    if not pool:
        raise ValueError("need other paragraphs to build a long context")
    rng.shuffle(pool)
    chosen, used, i = [], 0, 0
    while used < budget:
        piece = pool[i % len(pool)]
        room = budget - used - 1  # one space joins each filler to the rest
        chosen.append(piece[:room])
        used += len(chosen[-1]) + 1
        i += 1
    slot = rng.randint(0, len(chosen))
    parts = [*chosen[:slot], paragraph, *chosen[slot:]]
    context = " ".join(parts)
    offset = sum(len(p) + 1 for p in chosen[:slot])
    return context, offset
