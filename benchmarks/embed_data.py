"""Texts for the embedding benchmarks: STS-B pairs, and a varied set of sentences (STS-B dev sentences
and hand-written texts that trip tokenizers and pooling: numbers, code, other scripts, emoji, texts far
past the model's 256 tokens, truncated as sentence-transformers truncates them).
"""

from __future__ import annotations

import csv
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared/data
STSB_DEV = Path("glue") / "STS-B" / "dev.tsv"

CRAFTED = [
    "Hi",
    "ok",
    "Paris",
    "42",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!!!",
    "the quick brown fox jumps over the lazy dog",
    "Café au lait, crème brûlée and a naïve façade in Zürich.",
    "Müller, Šťastný and Øster met in Kraków on 3 May 2021.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "مرحبا بالعالم",
    "I love this movie 😍🔥👍",
    "def add(a, b):\n    return a + b  # adds two numbers",
    "SELECT name, COUNT(*) FROM users WHERE age > 30 GROUP BY name;",
    "Call +1 (555) 010-9999 or e-mail info@example.com before 5:30pm.",
    "The price rose from $1,299.99 to $1,549.00 (+19.2%) in Q3 2024.",
    "   leading and trailing spaces   ",
    "tabs\tand\nnew\nlines\tinside",
    "a a a a a a a a a a a a a a a a a a a a",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism.",
    "It's not that I don't like it; it's that I can't afford it.",
    "Is this the real life? Is this just fantasy?",
    "No.",
    "Dr. J. R. R. Tolkien wrote 'The Hobbit' (1937) & 'The Lord of the Rings'.",
    "https://example.com/path?query=1&other=two#fragment",
    "C'est la vie, mon ami.",
    "El perro corre en el parque con su dueño.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "A man is playing a guitar on a stage in front of a large crowd at night.",
    # Far beyond 256 tokens: both sides keep the first 256 tokens.
    "The committee met again on Tuesday to discuss the budget. " * 30,
    " ".join(f"word{i}" for i in range(400)),
    "Long sentence with many clauses, " * 60 + "and an end.",
    "🙂" * 300,
    "In 1969, Neil Armstrong and Buzz Aldrin landed on the Moon, while Michael Collins orbited above; "
    "the mission, Apollo 11, returned safely to Earth on July 24 after eight days in space.",
    "Stocks fell sharply on Monday as investors worried about rising interest rates.",
    "The patient was given 5 mg of the drug twice daily for two weeks.",
    "Please reset my password, I can't log in to my account anymore.",
    "Q: What is the capital of Australia? A: Canberra.",
    "She sells seashells by the seashore.",
]


def read_sts(path: Path) -> list[tuple[str, str, float]]:
    """(sentence1, sentence2, score) of a GLUE STS-B TSV file (quotes are literal text)."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(r["sentence1"], r["sentence2"], float(r["score"])) for r in rows]


def varied_sentences(data_dir: Path, n: int = 200) -> list[str]:
    """`n` texts: the crafted ones, then STS-B dev sentences spread evenly over the file (every
    genre, every length); only the crafted ones when the data is absent."""
    out = list(CRAFTED)
    path = data_dir / STSB_DEV
    if path.exists():
        pool = list(dict.fromkeys(s for a, b, _ in read_sts(path) for s in (a, b)))
        need = n - len(out)
        step = len(pool) / need
        out += [pool[int(i * step)] for i in range(need)]
    return out[:n]
