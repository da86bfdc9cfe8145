"""The bar for every Chinese news classifier here: simple baselines on the fixed Toutiao split.

    python -m train.zh_baseline --data ../shared/data

Same split as fine-tuning (`train.corpus.split_toutiao`, seed 42: 27,826 / 3,478 / 3,478), no
pretraining, no tuning (every setting below is the library's or fastText's default):
- majority class: the most frequent training label;
- TF-IDF over character 1-3-grams (sublinear tf) with a linear SVM (scikit-learn);
- fastText-style bag of characters: the mean of learned character embeddings, dimension 100,
  into a linear softmax, 5 epochs of one-example SGD steps at lr 0.1 decaying linearly to 0, as
  fastText's supervised defaults (minutes of CPU: one step per headline).

Writes benchmarks/results/zh_baseline.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path

import numpy as np

from .corpus import TOUTIAO, read_toutiao, split_toutiao

REPO = Path(__file__).resolve().parent.parent
# The book's labels 0-14 are the dataset's category codes 100-116 (105 and 111 unused) in order;
# names from the dataset's readme (aceimnorstuvwxz/toutiao-text-classfication-dataset).
CATEGORIES = "民生 文化 娱乐 体育 财经 房产 汽车 教育 科技 军事 旅游 国际 证券 农业 电竞".split()


def accuracy(predicted, gold) -> float:
    return float(np.mean(np.asarray(predicted) == np.asarray(gold)))


def majority(train, parts) -> dict:
    label = Counter(y for _, y in train).most_common(1)[0][0]
    return {name: accuracy([label] * len(rows), [y for _, y in rows]) for name, rows in parts.items()}


def tfidf_svm(train, parts) -> dict:
    from .distill import ngram_svm  # the baseline's model, which is also distillation's teacher

    model = ngram_svm().fit([t for t, _ in train], [y for _, y in train])
    return {
        name: accuracy(model.predict([t for t, _ in rows]), [y for _, y in rows])
        for name, rows in parts.items()
    }


def characters(text: str) -> list[str]:
    return [c for c in text if not c.isspace()]


def fasttext_style(train, parts, seed: int = 42) -> dict:
    """fastText's supervised model: mean of the input's n-gram embeddings -> linear -> softmax."""
    import torch

    torch.manual_seed(seed)
    vocab = {g: i for i, g in enumerate(sorted({g for t, _ in train for g in characters(t)}))}
    labels = sorted({y for _, y in train})

    def encode(rows):
        ids = [[vocab[g] for g in characters(t) if g in vocab] or [0] for t, _ in rows]
        offsets = torch.tensor([0, *np.cumsum([len(i) for i in ids])[:-1]])
        return torch.tensor([i for row in ids for i in row]), offsets, ids

    bag = torch.nn.EmbeddingBag(len(vocab), 100, mode="mean", sparse=True)
    torch.nn.init.uniform_(bag.weight, -1 / 100, 1 / 100)  # fastText's input init
    out = torch.nn.Linear(100, len(labels), bias=False)
    torch.nn.init.zeros_(out.weight)  # fastText's output init
    optimizer = torch.optim.SGD([*bag.parameters(), *out.parameters()], lr=0.1)
    y = torch.tensor([labels.index(label) for _, label in train])
    _, _, ids = encode(train)
    epochs, total = 5, 5 * len(train)
    rng = np.random.default_rng(seed)
    for epoch in range(epochs):
        for k, i in enumerate(rng.permutation(len(train))):  # one example per update, as fastText
            for group in optimizer.param_groups:
                group["lr"] = 0.1 * (1 - (epoch * len(train) + k) / total)
            loss = torch.nn.functional.cross_entropy(out(bag(torch.tensor([ids[i]]))), y[i : i + 1])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    scores = {}
    with torch.no_grad():
        for name, rows in parts.items():
            flat, offsets, _ = encode(rows)
            predicted = out(bag(flat, offsets)).argmax(-1).tolist()
            scores[name] = accuracy([labels[p] for p in predicted], [y for _, y in rows])
    return scores


BASELINES = {
    "majority class": majority,
    "TF-IDF char 1-3-grams + LinearSVC": tfidf_svm,
    "fastText-style bag of characters": fasttext_style,
}


def run(data: Path, only: list[str] | None = None) -> dict:
    split = split_toutiao(read_toutiao(data / TOUTIAO))
    parts = {"valid": split["valid"], "test": split["test"]}
    results = {}
    for name, baseline in BASELINES.items():
        if only and name not in only:
            continue
        started = time.time()
        results[name] = {**baseline(split["train"], parts), "seconds": round(time.time() - started, 1)}
        print(name, results[name], flush=True)
    return {
        "split": {name: len(rows) for name, rows in split.items()},
        "command": "python -m train.zh_baseline --data ../shared/data",
        "load_average_at_start": round(os.getloadavg()[0], 1),
        "baselines": results,
    }


def write(report: dict, out: Path) -> None:
    lines = [
        "# Toutiao headlines, 15 classes: baselines on the fixed split",
        "",
        f"Split `train.corpus.split_toutiao` (seed 42): {report['split']['train']:,} train / "
        f"{report['split']['valid']:,} valid / {report['split']['test']:,} test headlines. "
        "No pretraining and no tuning: library or fastText defaults.",
        "",
        "| baseline | valid accuracy | test accuracy | train + predict time |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} | {r['valid']:.4f} | {r['test']:.4f} | {r['seconds']:.0f} s |"
            for name, r in report["baselines"].items()
        ),
        "",
        f"Command: `{report['command']}` (train/zh_baseline.py says what each row is). Times: the "
        f"shared 2-core CPU, load average {report['load_average_at_start']} at the start.",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(prog="python -m train.zh_baseline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "zh_baseline.json")
    args = p.parse_args(argv)
    if not (args.data / TOUTIAO).exists():
        print(f"{args.data / TOUTIAO} is absent: no baseline to compute; skipping")
        return None
    report = run(args.data)
    write(report, args.out)
    print(f"wrote {args.out}, {args.out.with_suffix('.md')}")
    return report


if __name__ == "__main__":
    main()
