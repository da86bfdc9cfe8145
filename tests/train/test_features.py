"""Features and their post-processing, checked with oracle outputs: logits that point at the
gold labels must score perfectly, and shifted ones must not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from processing.tokenizer import TextTokenizer
from tests.helpers.tiny import write_tokenizer_files
from train.features import IGNORE, TASK_FEATURES, FeatureOptions
from train.readers import ClassifyExample, NERExample, read_examples

from .tiny_data import write_task_data


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    directory = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(directory)
    return TextTokenizer.from_dir(directory)


def qa_oracle(data, shift: int = 0) -> list:
    outputs = []
    for item in data.items:
        n = len(item["enc"])
        start, end = np.zeros(n), np.zeros(n)
        if item["start"] > 0:  # the answer is in this window
            start[min(item["start"] + shift, n - 1)] = end[min(item["end"] + shift, n - 1)] = 20.0
        outputs.append((start, end))
    return outputs


def test_qa_windows_and_answers(tokenizer: TextTokenizer, tmp_path: Path) -> None:
    examples = read_examples("qa", write_task_data("qa", tmp_path))
    task = TASK_FEATURES["qa"](tokenizer, FeatureOptions(max_seq_len=20, doc_stride=4, max_query_len=8))
    data = task.features(examples, train=False)
    assert len(data) > len(examples)  # long contexts were windowed
    # every example has at least one window that holds its answer
    holding = {item["example"] for item in data.items if item["start"] > 0}
    assert holding == set(range(len(examples)))
    assert task.metrics(data, qa_oracle(data)) == {"exact_match": 100.0, "f1": 100.0}
    assert task.metrics(data, qa_oracle(data, shift=1))["exact_match"] < 100.0


def test_qa_labels_cls_when_answer_outside_window(tokenizer: TextTokenizer, tmp_path: Path) -> None:
    examples = read_examples("qa", write_task_data("qa", tmp_path))
    task = TASK_FEATURES["qa"](tokenizer, FeatureOptions(max_seq_len=20, doc_stride=4, max_query_len=8))
    data = task.features(examples, train=True)
    outside = [item for item in data.items if item["start"] == 0]
    assert outside and all(item["end"] == 0 for item in outside)
    for item in data.items:
        if item["start"] > 0:
            token = int(item["enc"].input_ids[item["start"]])
            answer = examples[item["example"]].answers[0][0]
            assert tokenizer.tokenizer.id_to_token(token) == answer


def test_qa_trains_on_the_answer_most_annotators_gave(tokenizer: TextTokenizer) -> None:
    from train.features import training_answer
    from train.readers import QAExample

    assert training_answer([("a", 0), ("b", 2), ("b", 2)]) == ("b", 2)
    assert training_answer([("a", 0), ("b", 2)]) == ("a", 0)  # a tie keeps the first
    context = "the cat sat on the mat"
    answers = [("the cat", 0), ("cat", 4), ("cat", 4)]
    task = TASK_FEATURES["qa"](tokenizer, FeatureOptions(max_seq_len=32, doc_stride=4, max_query_len=8))
    item = task.features([QAExample("q", "who sat", context, answers)], train=True).items[0]
    first = tokenizer.tokenizer.id_to_token(int(item["enc"].input_ids[item["start"]]))
    assert first == "cat" and item["start"] == item["end"]


def test_ner_word_level_eval_with_windows(tokenizer: TextTokenizer) -> None:
    words = "john smith lives in paris and mary works for the company in london".split()
    tags = ["B-PER", "I-PER", "O", "O", "B-LOC", "O", "B-PER", "O", "O", "O", "B-ORG", "O", "B-LOC"]
    task = TASK_FEATURES["ner"](tokenizer, FeatureOptions(max_seq_len=8, window_overlap=2))
    examples = [NERExample(words, tags)]
    task.fit_labels(examples)
    data = task.features(examples, train=False)
    assert len(data) > 1  # the sentence is split into windows
    n_labels = len(task.id2label)
    outputs = []
    for item in data.items:
        logits = np.zeros((len(item["enc"]), n_labels))
        logits[item["labels"] != IGNORE, item["labels"][item["labels"] != IGNORE]] = 10.0
        outputs.append(logits)
    scores = task.metrics(data, outputs)
    assert scores["f1"] == 1.0 and scores["token_accuracy"] == 1.0
    wrong = [np.roll(o, 1, axis=1) for o in outputs]
    assert task.metrics(data, wrong)["f1"] < 1.0


def test_ner_labels_on_first_subtoken_only(tokenizer: TextTokenizer) -> None:
    task = TASK_FEATURES["ner"](tokenizer, FeatureOptions(max_seq_len=32))
    examples = [NERExample(["xyz", "paris"], ["B-ORG", "B-LOC"])]  # "xyz" splits into sub-tokens
    task.fit_labels(examples)
    labels = task.features(examples, train=True).items[0]["labels"]
    ids = {v: k for k, v in task.id2label.items()}
    assert labels[0] == labels[-1] == IGNORE  # [CLS], [SEP]
    assert labels[1] == ids["B-ORG"] and all(labels[2:-2] == IGNORE) and labels[-2] == ids["B-LOC"]


def test_unknown_ner_tag_in_validation_is_an_error(tokenizer: TextTokenizer) -> None:
    task = TASK_FEATURES["ner"](tokenizer, FeatureOptions())
    task.fit_labels([NERExample(["paris"], ["B-LOC"])])
    with pytest.raises(ValueError, match="B-PER"):
        task.features([NERExample(["john"], ["B-PER"])], train=False)


def test_classify_long_text_windows_aggregate_per_document(tokenizer: TextTokenizer) -> None:
    long_good = " ".join(["good"] + ["the"] * 30)
    examples = [ClassifyExample(long_good, None, "positive"), ClassifyExample("bad", None, "negative")]
    task = TASK_FEATURES["classify"](
        tokenizer, FeatureOptions(max_seq_len=12, long_text="windows", window_overlap=2)
    )
    task.fit_labels(examples)
    data = task.features(examples, train=False)
    assert [item["doc"] for item in data.items].count(0) > 1
    # Each window votes for its document's label, except one dissenting window of document 0:
    # the mean over windows still picks the label.
    outputs = [np.array([0.0, 3.0]) if item["doc"] == 0 else np.array([3.0, 0.0]) for item in data.items]
    outputs[0] = np.array([1.0, 0.0])
    assert task.metrics(data, outputs)["accuracy"] == 1.0
    flipped = [o[::-1] for o in outputs]
    assert task.metrics(data, flipped)["accuracy"] == 0.0


def test_classify_labels_and_regression(tokenizer: TextTokenizer) -> None:
    task = TASK_FEATURES["classify"](tokenizer, FeatureOptions())
    task.fit_labels([ClassifyExample("a", None, v) for v in ["10", "2", "0"]])
    assert task.id2label == {0: "0", 1: "2", 2: "10"}  # numeric order
    task.fit_labels([ClassifyExample("a", None, v) for v in ["4.5", "3.0"]])
    assert task.problem_type == "regression" and task.id2label == {0: "score"}
    examples = [ClassifyExample("a", "b", v) for v in ["1.0", "2.5", "4.0"]]
    data = task.features(examples, train=False)
    assert task.collate(data.items)["labels"].dtype == np.float32
    scores = task.metrics(data, [np.array([v]) for v in (0.5, 1.0, 3.0)])
    assert scores["spearman"] == pytest.approx(1.0) and scores["pearson"] < 1.0


def test_unknown_classify_label_is_an_error(tokenizer: TextTokenizer) -> None:
    task = TASK_FEATURES["classify"](tokenizer, FeatureOptions())
    task.fit_labels([ClassifyExample("a", None, "pos"), ClassifyExample("b", None, "neg")])
    with pytest.raises(ValueError, match="'neutral' is not among the training labels"):
        task.features([ClassifyExample("c", None, "neutral")], train=False)


def test_multiple_choice_collate_and_accuracy(tokenizer: TextTokenizer, tmp_path: Path) -> None:
    examples = read_examples("multiple-choice", write_task_data("multiple-choice", tmp_path))
    task = TASK_FEATURES["multiple-choice"](tokenizer, FeatureOptions(max_seq_len=24))
    data = task.features(examples, train=True)
    batch = task.collate(data.items[:3])
    assert batch["input_ids"].shape[:2] == (3, 4)
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    gold = [item["label"] for item in data.items]
    assert task.metrics(data, [np.eye(4)[g] for g in gold])["accuracy"] == 1.0
    assert task.metrics(data, [np.eye(4)[(g + 1) % 4] for g in gold])["accuracy"] == 0.0
