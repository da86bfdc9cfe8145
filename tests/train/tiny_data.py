"""Tiny, learnable data files in the real formats, written from words of the tiny test vocab."""

from __future__ import annotations

import json
import random
from pathlib import Path

FILLER = "the a of to in and is was it this that on at by for with from as".split()
POSITIVE = ["good", "great", "fun", "love"]
NEGATIVE = ["bad", "terrible", "boring", "hate"]
PEOPLE = [["john"], ["mary"], ["john", "smith"], ["mary", "smith"]]
PLACES = ["paris", "france", "london", "berlin", "germany"]
ORGS = ["company", "team"]


def _filler(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(FILLER) for _ in range(n)]


def write_classify_tsv(path: Path, n: int = 32, seed: int = 0) -> Path:
    """SST-2 layout: `sentence\\tlabel` header, label names negative/positive."""
    rng = random.Random(seed)
    lines = ["sentence\tlabel"]
    for i in range(n):
        positive = i % 2 == 0
        words = _filler(rng, 3) + [rng.choice(POSITIVE if positive else NEGATIVE)] + _filler(rng, 2)
        lines.append(f"{' '.join(words)} \t{'positive' if positive else 'negative'}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_conll(path: Path, n: int = 24, seed: int = 0) -> Path:
    """CoNLL-2003 columns, IOB2 tags, -DOCSTART- every 8 sentences."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        if i % 8 == 0:
            lines += ["-DOCSTART- -X- -X- O", ""]
        person, place = rng.choice(PEOPLE), rng.choice(PLACES)
        tokens = [(w, "B-PER" if k == 0 else "I-PER") for k, w in enumerate(person)]
        tokens += [(w, "O") for w in ["lives", "in"]] + [(place, "B-LOC")]
        tokens += [(w, "O") for w in _filler(rng, 2)] + [(rng.choice(ORGS), "B-ORG"), (".", "O")]
        lines += [f"{w} NN I-NP {t}" for w, t in tokens] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_codah(path: Path, n: int = 24, seed: int = 0) -> Path:
    """CODAH TSV: category, prompt, four endings, answer; the right ending is the positive one."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        endings = [f"{rng.choice(NEGATIVE)} {' '.join(_filler(rng, 2))}" for _ in range(4)]
        answer = rng.randrange(4)
        endings[answer] = f"{rng.choice(POSITIVE)} {' '.join(_filler(rng, 2))}"
        prompt = f"the {rng.choice(['cat', 'dog'])} {rng.choice(['ran', 'sat'])} and it was"
        lines.append("\t".join(["o", prompt, *endings, str(answer)]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def squad_data(n: int = 24, seed: int = 0, articles: int = 4) -> dict:
    """SQuAD v1.1 JSON: "what is the capital ?" answered by the word after "capital is"."""
    rng = random.Random(seed)
    data = []
    for a in range(articles):
        paragraphs = []
        for _ in range(n // articles):
            city = rng.choice(PLACES)
            before, after = " ".join(_filler(rng, rng.randrange(2, 12))), " ".join(_filler(rng, 4))
            context = f"{before} the capital is {city} . {after}"
            start = context.index(f"capital is {city}") + len("capital is ")
            qa = {
                "id": f"q{a}-{len(paragraphs)}",
                "question": "what is the capital ?",
                "answers": [{"text": city, "answer_start": start}],
            }
            paragraphs.append({"context": context, "qas": [qa]})
        data.append({"title": f"article{a}", "paragraphs": paragraphs})
    return {"version": "1.1", "data": data}


def write_squad(path: Path, n: int = 24, seed: int = 0) -> Path:
    path.write_text(json.dumps(squad_data(n, seed)), encoding="utf-8")
    return path


WRITERS = {
    "classify": ("train.tsv", write_classify_tsv),
    "ner": ("train.txt", write_conll),
    "multiple-choice": ("train.tsv", write_codah),
    "qa": ("train.json", write_squad),
}


def write_task_data(task: str, directory: Path, seed: int = 0) -> Path:
    name, writer = WRITERS[task]
    directory.mkdir(parents=True, exist_ok=True)
    return writer(directory / name, seed=seed)
