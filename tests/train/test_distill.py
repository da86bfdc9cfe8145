"""Distillation: the n-gram teacher's soft labels, their file, the loss that reads them, and a run
that learns what the teacher says rather than the labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model.bert import TASK_HEADS
from processing.tokenizer import TextTokenizer
from tests.helpers.tiny import make_tiny_checkpoint
from train import distill
from train.examples import ClassifyExample, DataError
from train.readers import read_examples
from train.splits import DataOptions, split_examples
from train.train import main

from .tiny_data import write_task_data

TOPICS = {"sport": "篮球比赛球员得分", "cars": "汽车新车销量上市", "world": "美国总统外交访问"}


def topic_texts(n: int = 60) -> tuple[list[str], list[str]]:
    labels = [list(TOPICS)[i % 3] for i in range(n)]
    texts = [f"{TOPICS[y][i % 4 :]}{TOPICS[y][: i % 4]}第{i}号" for i, y in enumerate(labels)]
    return texts, labels


def test_out_of_fold_soft_labels_know_the_topics_and_read_back_in_the_models_order(tmp_path: Path) -> None:
    texts, labels = topic_texts()
    report = distill.write_soft_labels(tmp_path / "soft.json", texts, None, labels)
    assert report["labels"] == ["cars", "sport", "world"] and report["out_of_fold_accuracy"] == 1.0
    assert set(report["scales"]) == {"chars"} and report["scales"]["chars"] in distill.SCALES
    order = {0: "world", 1: "sport", 2: "cars"}
    examples = [ClassifyExample(t, None, y) for t, y in zip(texts, labels, strict=True)]
    soft, transfer = distill.read_soft_labels(tmp_path / "soft.json", order, examples)
    assert len(soft) == len(texts) and transfer == []
    for text, label in zip(texts, labels, strict=True):
        assert order[int(np.argmax(soft[(text, None)]))] == label  # columns follow the model's labels


def test_two_classes_get_two_logits_each(tmp_path: Path) -> None:
    # A binary SVM gives one margin per text; the soft labels still hold one logit per class.
    texts, labels = topic_texts()
    pairs = [(t, y) for t, y in zip(texts, labels, strict=True) if y != "world"]
    report = distill.write_soft_labels(
        tmp_path / "soft.json", [t for t, _ in pairs], None, [y for _, y in pairs]
    )
    assert report["labels"] == ["cars", "sport"] and report["out_of_fold_accuracy"] == 1.0
    logits = np.asarray(json.loads((tmp_path / "soft.json").read_text(encoding="utf-8"))["logits"])
    assert logits.shape == (len(pairs), 2)
    np.testing.assert_allclose(np.exp(logits).sum(1), 1, atol=1e-3)  # log-probabilities of two classes


def test_soft_labels_for_other_labels_are_refused(tmp_path: Path) -> None:
    texts, labels = topic_texts()
    distill.write_soft_labels(tmp_path / "soft.json", texts, None, labels)
    with pytest.raises(DataError, match="soft labels for"):
        distill.read_soft_labels(tmp_path / "soft.json", {0: "negative", 1: "positive"}, [])


def test_the_distilled_loss_mixes_the_label_loss_and_the_teachers_kl() -> None:
    torch.manual_seed(0)
    logits, teacher, labels = torch.randn(4, 3), torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    hard = F.cross_entropy(logits, labels)
    assert torch.allclose(distill.distilled_loss(logits, labels, teacher, 0.0), hard)
    assert float(distill.distilled_loss(logits, labels, logits.clone(), 1.0)) == pytest.approx(0.0, abs=1e-6)
    kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(teacher, -1), reduction="batchmean")
    assert torch.allclose(distill.distilled_loss(logits, labels, teacher, 0.25), 0.75 * hard + 0.25 * kl)


def test_a_transfer_text_learns_from_the_teacher_alone() -> None:
    torch.manual_seed(0)
    logits, teacher = torch.randn(4, 3), torch.randn(4, 3)
    unlabelled = torch.full((4,), distill.IGNORE)
    kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(teacher, -1), reduction="batchmean")
    for weight in (0.0, 0.5):  # the weight splits a gold label's loss; a transfer text has none
        assert torch.allclose(distill.distilled_loss(logits, unlabelled, teacher, weight), kl)
    mixed = torch.tensor([0, distill.IGNORE, 2, distill.IGNORE])
    rows = [
        distill.distilled_loss(logits[i : i + 1], mixed[i : i + 1], teacher[i : i + 1], 0.5) for i in range(4)
    ]
    assert torch.allclose(distill.distilled_loss(logits, mixed, teacher, 0.5), torch.stack(rows).mean())


def test_transfer_texts_get_the_full_teachers_logits(tmp_path: Path) -> None:
    texts, labels = topic_texts()
    unlabelled = [
        "篮球球员得分",
        "新车上市销量",
        texts[0],
        "篮球球员得分",
        " ",
    ]  # a training text, a repeat, a blank
    report = distill.write_soft_labels(tmp_path / "soft.json", texts, None, labels, unlabelled)
    assert report["transfer_texts"] == 2
    order = {0: "world", 1: "sport", 2: "cars"}
    examples = [ClassifyExample(t, None, y) for t, y in zip(texts, labels, strict=True)]
    soft, transfer = distill.read_soft_labels(tmp_path / "soft.json", order, examples)
    assert transfer == ["篮球球员得分", "新车上市销量"] and len(soft) == len(texts) + 2
    assert [order[int(np.argmax(soft[(t, None)]))] for t in transfer] == ["sport", "cars"]
    with pytest.raises(ValueError, match="text-pair"):
        distill.write_soft_labels(tmp_path / "pairs.json", texts, texts, labels, unlabelled)


def train_args(base: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        *("--task", "classify", "--base", str(base), "--train", str(data), "--out", str(out)),
        *("--max-steps", "30", "--batch-size", "8", "--max-seq-len", "32", "--lr", "3e-3"),
        *("--schedule", "constant", "--weight-decay", "0", "--no-progress", "--eval-every", "1000"),
        *extra,
    ]


def predictions(checkpoint: Path, data: Path) -> list[str]:
    model = TASK_HEADS["classify"].from_pretrained(checkpoint).eval()
    tokenizer = TextTokenizer.from_dir(checkpoint)
    texts = [e.text for e in read_examples("classify", data)]
    with torch.no_grad():
        logits = torch.cat(
            [model(torch.as_tensor(tokenizer.encode(t).input_ids)[None]).logits for t in texts]
        )
    return [model.config.id2label[int(i)] for i in logits.argmax(-1)]


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_a_run_with_soft_labels_learns_the_teacher(weight: float, tmp_path: Path) -> None:
    # A teacher that calls every text "negative": with all weight on it the model learns that,
    # and with none it learns the labels (half positive).
    base = make_tiny_checkpoint("classify", tmp_path / "base")
    data = write_task_data("classify", tmp_path / "data")
    texts = [e.text for e in read_examples("classify", data)]
    soft = {"labels": ["negative", "positive"], "texts": texts, "logits": [[6.0, -6.0]] * len(texts)}
    (tmp_path / "soft.json").write_text(json.dumps(soft))
    out = tmp_path / "out"
    main(
        train_args(
            base, data, out, "--soft-labels", str(tmp_path / "soft.json"), "--distill-weight", str(weight)
        )
    )
    predicted = predictions(out, data)
    if weight == 1.0:
        assert set(predicted) == {"negative"}
    else:
        assert predicted.count("positive") >= len(texts) // 3


def test_soft_labels_must_cover_every_training_text(tmp_path: Path) -> None:
    base = make_tiny_checkpoint("classify", tmp_path / "base")
    data = write_task_data("classify", tmp_path / "data")
    soft = {"labels": ["negative", "positive"], "texts": ["not in the data"], "logits": [[1.0, 0.0]]}
    (tmp_path / "soft.json").write_text(json.dumps(soft))
    with pytest.raises(DataError, match="no logits for 32 training texts"):
        main(train_args(base, data, tmp_path / "out", "--soft-labels", str(tmp_path / "soft.json")))


def test_a_run_learns_transfer_texts_from_the_teacher(tmp_path: Path) -> None:
    # The gold labels teach nothing here (weight 1); unlabelled texts that the teacher calls
    # "positive" outnumber the training texts it calls "negative", and the run follows them.
    base = make_tiny_checkpoint("classify", tmp_path / "base")
    data = write_task_data("classify", tmp_path / "data")
    texts = [e.text for e in read_examples("classify", data)]
    transfer = [f"{t} {t}" for t in texts] * 3
    soft = {
        "labels": ["negative", "positive"],
        **{"texts": texts, "logits": [[1.0, 0.0]] * len(texts)},
        **{"transfer_texts": transfer, "transfer_logits": [[-6.0, 6.0]] * len(transfer)},
    }
    (tmp_path / "soft.json").write_text(json.dumps(soft))
    out = tmp_path / "out"
    main(train_args(base, data, out, "--soft-labels", str(tmp_path / "soft.json"), "--distill-weight", "1"))
    assert set(predictions(out, data)) == {"positive"}
    assert json.loads((out / "metrics.json").read_text())["train_features"] == len(texts) * 4


def test_the_distill_command_writes_soft_labels_for_a_training_file(tmp_path: Path) -> None:
    texts, labels = topic_texts()
    data = tmp_path / "train.txt"
    data.write_text("".join(f"{t}_!_{y}\n" for t, y in zip(texts, labels, strict=True)), encoding="utf-8")
    distill.main(["--train", str(data), "--out", str(tmp_path / "soft.json")])
    saved = json.loads((tmp_path / "soft.json").read_text(encoding="utf-8"))
    assert saved["texts"] == texts and np.asarray(saved["logits"]).shape == (60, 3)
    assert saved["teacher"].startswith(distill.TEACHERS["chars"][0]) and "pairs" not in saved


def test_a_teacher_of_the_subset_a_run_trains_on(tmp_path: Path) -> None:
    # --limit-train picks the same headlines as python -m train does, and only those teach.
    texts, labels = topic_texts()
    data = tmp_path / "train.txt"
    data.write_text("".join(f"{t}_!_{y}\n" for t, y in zip(texts, labels, strict=True)), encoding="utf-8")
    distill.main(["--train", str(data), "--out", str(tmp_path / "soft.json"), "--limit-train", "30"])
    saved = json.loads((tmp_path / "soft.json").read_text(encoding="utf-8"))
    picked = split_examples(DataOptions("classify", data, limit_train=30))[0]
    assert saved["texts"] == [e.text for e in picked] and len(picked) == 30


def test_the_word_teacher_joins_the_characters(tmp_path: Path) -> None:
    # Each topic's headlines share words, not one fixed string: jieba's words carry the topic too.
    texts, labels = topic_texts()
    report = distill.write_soft_labels(
        tmp_path / "soft.json", texts, None, labels, teachers=("chars", "words")
    )
    assert set(report["scales"]) == {"chars", "words"} and report["out_of_fold_accuracy"] == 1.0
    assert distill.TEACHERS["words"][0] in report["teacher"]
    assert distill.chinese_words("NBA篮球比赛 ") == ["nba", "篮球比赛"]  # lower-cased words, no spaces
    logits = np.asarray(json.loads((tmp_path / "soft.json").read_text(encoding="utf-8"))["logits"])
    np.testing.assert_allclose(np.exp(logits).sum(1), 1, atol=1e-3)  # a mean of log-probabilities, near 1


def test_an_unknown_teacher_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        distill.main(["--train", "x.txt", "--out", str(tmp_path / "s.json"), "--teacher", "chars,bigrams"])
    assert "unknown teacher ['bigrams']" in capsys.readouterr().err
