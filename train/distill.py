"""Soft labels for distillation: a teacher's logits for every training text, and the loss that
reads them.

    python -m train.distill --train FILE --out soft_labels.json    # the n-gram teacher
    python -m train.distill --train FILE --teacher chars,words --unlabelled news.txt --out soft_labels.json
    python -m train --task classify --train FILE --soft-labels soft_labels.json ...

The teacher is the baseline every Chinese classifier must clear (train.zh_baseline): TF-IDF over
character 1-3-grams with a linear SVM; `--teacher chars,words` averages it with an SVM over jieba's
words. Each training text is scored by teachers fitted on the other folds (out-of-fold), so the
student learns how the teacher generalises, not how it memorised the text. Each SVM's margins
become log-probabilities through one scale, chosen by its out-of-fold log-likelihood: training
data only, so validation and test stay unseen. `--unlabelled` texts (a transfer set) are scored by
the teachers fitted on all the training texts; the student learns them from those logits alone.

The file is JSON: {"labels": [names, in the logits' column order], "teacher": what it is, "scales":
{teacher: margin scale}, "texts": [...], "pairs": [...] or absent, "logits": [[...], ...],
"transfer_texts": [...] and "transfer_logits": [[...], ...] when there is a transfer set}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .examples import DataError
from .features import IGNORE  # the label of a transfer text, which has no gold label

SCALES = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)


def ngram_svm():
    """The baseline's model: TF-IDF over character 1-3-grams (sublinear tf) and a linear SVM, with
    the libraries' defaults otherwise."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_pipeline
    from sklearn.svm import LinearSVC

    return make_pipeline(TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True), LinearSVC())


def chinese_words(text: str) -> list[str]:
    import jieba

    jieba.setLogLevel(60)  # its dictionary-loading chatter
    return [w for w in jieba.lcut(text.lower()) if w.strip()]


def word_svm():
    """TF-IDF over jieba's words (sublinear tf) and a linear SVM: words the characters' n-grams
    cut across. With the characters' SVM it scores 0.824 out of fold on the Toutiao training split,
    against 0.817 for the characters alone (docs/pretraining.md)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_pipeline
    from sklearn.svm import LinearSVC

    return make_pipeline(TfidfVectorizer(analyzer=chinese_words, sublinear_tf=True), LinearSVC())


TEACHERS = {
    "chars": ("TF-IDF char 1-3-grams + LinearSVC", ngram_svm),
    "words": ("TF-IDF jieba words + LinearSVC", word_svm),
}


def margins_of(model, texts: list[str], n_classes: int) -> np.ndarray:
    """(N, n_classes) margins of a fitted teacher; a class it never saw keeps 0."""
    scores = model.decision_function(texts)
    if scores.ndim == 1:  # two classes: one margin, for classes_[1]; softmax of (-s/2, s/2) is sigmoid(s)
        scores = np.stack([-scores, scores], axis=1) / 2
    margins = np.zeros((len(texts), n_classes), dtype=np.float32)
    margins[:, model.classes_] = scores
    return margins


def out_of_fold_margins(make, texts: list[str], y: np.ndarray, n_classes: int, folds: int = 5, seed: int = 0):
    """(N, C) margins, each row from a model `make()` fitted without its fold."""
    from sklearn.model_selection import StratifiedKFold

    margins = np.zeros((len(texts), n_classes), dtype=np.float32)
    for fit, held in StratifiedKFold(folds, shuffle=True, random_state=seed).split(texts, y):
        model = make().fit([texts[i] for i in fit], y[fit])
        margins[held] = margins_of(model, [texts[i] for i in held], n_classes)
    return margins


def best_scale(margins: np.ndarray, y: np.ndarray) -> float:
    """The margin scale with the lowest cross-entropy: the SVM's margins as calibrated logits."""
    logits, target = torch.from_numpy(margins), torch.from_numpy(y)
    return min(SCALES, key=lambda s: float(F.cross_entropy(logits * s, target)))


def log_probs(margins: np.ndarray, scale: float) -> np.ndarray:
    return F.log_softmax(torch.from_numpy(margins * scale), -1).numpy()


def write_soft_labels(
    out: Path, texts, pairs, labels, unlabelled: list[str] = (), teachers: tuple[str, ...] = ("chars",)
) -> dict:
    """Each teacher's out-of-fold margins, at the scale that calibrates them, as log-probabilities,
    averaged over the teachers: the logits of the training texts. For `unlabelled` texts (a transfer
    set, single texts only) the same from each teacher fitted on all the training texts."""
    keys = texts if pairs is None else [f"{t}\t{p}" for t, p in zip(texts, pairs, strict=True)]
    classes = sorted(set(labels))
    y = np.array([classes.index(label) for label in labels])
    seen = set(texts)
    transfer = [t for t in dict.fromkeys(unlabelled) if t.strip() and t not in seen]
    if transfer and pairs:
        raise ValueError("a transfer set of single texts cannot teach a text-pair classifier")
    scales, logits, transfer_logits = {}, [], []
    for name in teachers:
        make = TEACHERS[name][1]
        margins = out_of_fold_margins(make, keys, y, len(classes))
        scales[name] = best_scale(margins, y)
        logits.append(log_probs(margins, scales[name]))
        if transfer:
            transfer_logits.append(
                log_probs(margins_of(make().fit(keys, y), transfer, len(classes)), scales[name])
            )
    logits = np.round(np.mean(logits, axis=0), 4)
    report = {
        "labels": classes,
        "teacher": " and ".join(TEACHERS[n][0] for n in teachers) + ", out of fold, mean log-probabilities",
        "scales": scales,
        "out_of_fold_accuracy": float(np.mean(logits.argmax(1) == y)),
    }
    data = {**report, "texts": texts, **({"pairs": pairs} if pairs else {}), "logits": logits.tolist()}
    if transfer:
        data["transfer_texts"] = transfer
        data["transfer_logits"] = np.round(np.mean(transfer_logits, axis=0), 4).tolist()
        report["transfer_texts"] = len(transfer)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, ensure_ascii=False))
    return report


def read_soft_labels(path: Path, id2label: dict[int, str], examples: list) -> tuple[dict, list[str]]:
    """(text, pair) -> logits in the model's label order, for every training example and every
    transfer text; and the transfer texts, which train on their logits alone."""
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
    transfer = data.get("transfer_texts", [])
    if transfer:
        transfer_logits = np.asarray(data["transfer_logits"], dtype=np.float32)[:, order]
        soft.update(zip(((t, None) for t in transfer), transfer_logits, strict=True))
    return soft, transfer


def distilled_loss(logits: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor, weight: float):
    """Per text: (1 - weight) x the label's cross-entropy + weight x KL(teacher || student); a
    transfer text (label IGNORE) has the KL alone. Averaged over the batch."""
    logits = logits.float()
    kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(teacher, -1), log_target=True, reduction="none")
    kl = kl.sum(-1)  # (B, C) -> (B,)
    labelled = labels != IGNORE
    ce = F.cross_entropy(logits, torch.where(labelled, labels, 0), reduction="none")
    return torch.where(labelled, (1 - weight) * ce + weight * kl, kl).mean()


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
    p.add_argument(
        "--unlabelled",
        type=Path,
        help="a transfer set: unlabelled texts, one per line, that the student learns from the teacher alone",
    )
    p.add_argument(
        "--teacher",
        default="chars",
        help=f"comma list of {','.join(TEACHERS)}, whose log-probabilities are averaged (words needs jieba)",
    )
    args = p.parse_args(argv)
    teachers = tuple(args.teacher.split(","))
    if unknown := set(teachers) - set(TEACHERS):
        p.error(f"unknown teacher {sorted(unknown)}: choose from {', '.join(TEACHERS)}")
    options = DataOptions(
        "classify", args.train, format=args.format, limit_train=args.limit_train, seed=args.seed
    )
    examples, _ = split_examples(options)
    pairs = [e.text_pair for e in examples]
    texts, labels = [e.text for e in examples], [e.label for e in examples]
    unlabelled = args.unlabelled.read_text(encoding="utf-8").splitlines() if args.unlabelled else []
    report = write_soft_labels(args.out, texts, pairs if any(pairs) else None, labels, unlabelled, teachers)
    print(json.dumps(report, ensure_ascii=False))
    return report


if __name__ == "__main__":
    main()
