"""Soft labels for distillation: a teacher's logits for every training text, and the loss that
reads them.

    python -m train.distill --train FILE --out soft_labels.json    # the n-gram teacher
    python -m train --task classify --train FILE --soft-labels soft_labels.json ...

The teacher here is the baseline every Chinese classifier must clear (train.zh_baseline):
TF-IDF over character 1-3-grams with a linear SVM. Each training text is scored by a teacher fitted
on the other folds (out-of-fold), so the student learns how the teacher generalises, not how it
memorised the text. The SVM's margins become logits through one scale, chosen by the
out-of-fold log-likelihood: training data only, so validation and test stay unseen.

The file is JSON: {"labels": [names, in the logits' column order], "teacher": what it is, "scale":
the margin scale, "texts": [...], "pairs": [...] or absent, "logits": [[...], ...]}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .examples import DataError

TEACHER = "TF-IDF char 1-3-grams + LinearSVC, 5-fold out-of-fold margins x scale"
SCALES = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)


def ngram_svm():
    """The baseline's model: TF-IDF over character 1-3-grams (sublinear tf) and a linear SVM, with
    the libraries' defaults otherwise."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_pipeline
    from sklearn.svm import LinearSVC

    return make_pipeline(TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True), LinearSVC())


def out_of_fold_margins(texts: list[str], labels: list[str], folds: int = 5, seed: int = 0):
    """(N, C) SVM margins, each row from the model fitted without its fold; and the C class names."""
    from sklearn.model_selection import StratifiedKFold

    classes = sorted(set(labels))
    y = np.array([classes.index(label) for label in labels])
    margins = np.zeros((len(texts), len(classes)), dtype=np.float32)
    for fit, held in StratifiedKFold(folds, shuffle=True, random_state=seed).split(texts, y):
        model = ngram_svm().fit([texts[i] for i in fit], y[fit])
        scores = model.decision_function([texts[i] for i in held])
        if scores.ndim == 1:  # two classes: one margin, for classes_[1]; softmax of (-s/2, s/2) is sigmoid(s)
            scores = np.stack([-scores, scores], axis=1) / 2
        margins[np.ix_(held, model.classes_)] = scores  # a class absent from a fold keeps 0
    return margins, classes


def best_scale(margins: np.ndarray, y: np.ndarray) -> float:
    """The margin scale with the lowest cross-entropy: the SVM's margins as calibrated logits."""
    logits, target = torch.from_numpy(margins), torch.from_numpy(y)
    return min(SCALES, key=lambda s: float(F.cross_entropy(logits * s, target)))


def write_soft_labels(out: Path, texts, pairs, labels) -> dict:
    keys = texts if pairs is None else [f"{t}\t{p}" for t, p in zip(texts, pairs, strict=True)]
    margins, classes = out_of_fold_margins(keys, labels)
    scale = best_scale(margins, np.array([classes.index(label) for label in labels]))
    logits = np.round(margins * scale, 4)
    accuracy = float(np.mean(np.array(classes)[logits.argmax(1)] == np.array(labels)))
    report = {"labels": classes, "teacher": TEACHER, "scale": scale, "out_of_fold_accuracy": accuracy}
    data = {**report, "texts": texts, **({"pairs": pairs} if pairs else {}), "logits": logits.tolist()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, ensure_ascii=False))
    return report


def read_soft_labels(path: Path, id2label: dict[int, str], examples: list) -> dict[tuple, np.ndarray]:
    """(text, pair) -> logits in the model's label order, for every training example."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    names = [id2label[i] for i in range(len(id2label))]
    if sorted(data["labels"]) != sorted(names):
        raise DataError(path, None, f"soft labels for {data['labels']}, but the model's labels are {names}")
    order = [data["labels"].index(name) for name in names]
    pairs = data.get("pairs") or [None] * len(data["texts"])
    logits = np.asarray(data["logits"], dtype=np.float32)[:, order]
    soft = dict(zip(zip(data["texts"], pairs, strict=True), logits, strict=True))
    missing = [e.text for e in examples if (e.text, e.text_pair) not in soft]
    if missing:
        raise DataError(path, None, f"no logits for {len(missing)} training texts, e.g. {missing[0][:80]!r}")
    return soft


def distilled_loss(hard_loss: torch.Tensor, logits: torch.Tensor, teacher: torch.Tensor, weight: float):
    """(1 - weight) x the label loss + weight x KL(teacher || student) over the classes."""
    kl = F.kl_div(
        F.log_softmax(logits.float(), -1), F.log_softmax(teacher, -1), log_target=True, reduction="batchmean"
    )
    return (1 - weight) * hard_loss + weight * kl


def main(argv: list[str] | None = None) -> dict:
    from .splits import DataOptions, split_examples

    p = argparse.ArgumentParser(prog="python -m train.distill", description=__doc__.split("\n\n")[0])
    p.add_argument("--train", type=Path, required=True, help="the classification training file")
    p.add_argument("--out", type=Path, required=True, help="the soft-labels JSON to write")
    p.add_argument("--format", default="auto", help="as python -m train --format")
    p.add_argument(
        "--limit-train", type=int, help="as python -m train: the same subset, for a teacher of it only"
    )
    p.add_argument("--seed", type=int, default=42, help="as python -m train --seed (picks the subset)")
    args = p.parse_args(argv)
    options = DataOptions(
        "classify", args.train, format=args.format, limit_train=args.limit_train, seed=args.seed
    )
    examples, _ = split_examples(options)
    pairs = [e.text_pair for e in examples]
    texts, labels = [e.text for e in examples], [e.label for e in examples]
    report = write_soft_labels(args.out, texts, pairs if any(pairs) else None, labels)
    print(json.dumps(report, ensure_ascii=False))
    return report


if __name__ == "__main__":
    main()
