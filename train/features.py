"""Examples -> model features -> metrics, for every fine-tuning task.

All pre- and post-processing goes through `processing/` (the same code serving runs):
QA windows/labels/answers via processing.qa, NER label alignment and word predictions via
processing.ner, choices via processing.choice, classification via processing.classify, and
padding via processing.padding. Features keep only ids (int32/int8) so large sets fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from processing import classify as pclassify
from processing import ner as pner
from processing import qa as pqa
from processing.choice import encode_choices
from processing.metrics import accuracy, entity_scores, f1_score, pearson, spearman, squad_scores
from processing.padding import pad_batch, pad_choices
from processing.tasks import TASKS as TASK_SPECS
from processing.tokenizer import TextTokenizer, default_window_overlap

from .examples import ChoiceExample, ClassifyExample, NERExample, QAExample

IGNORE = -100
DEFAULT_METRIC = {
    **{name: spec.metric for name, spec in TASK_SPECS.items() if spec.trained and spec.metric},
    "pretrain": "mlm_accuracy",
}


# What each task's evaluation reports (NER adds f1_<TYPE> per entity type); all add "loss".
METRICS = {
    "classify": ("accuracy", "f1", "pearson", "spearman", "corr"),
    "ner": ("precision", "recall", "f1", "token_accuracy"),
    "multiple-choice": ("accuracy",),
    "qa": ("exact_match", "f1"),
    "pretrain": ("mlm_accuracy", "nsp_accuracy"),
}


def check_metric(task: str, metric: str) -> None:
    if metric == "loss" or metric in METRICS[task] or (task == "ner" and metric.startswith("f1_")):
        return
    raise ValueError(
        f"--metric-for-best {metric!r} is not reported for {task}; choose one of "
        f"{', '.join((*METRICS[task], 'loss'))}"
    )


@dataclass
class FeatureOptions:
    max_seq_len: int = 128
    doc_stride: int = 128
    max_query_len: int = 64
    max_answer_len: int = 30
    long_text: str = "truncate"
    window_overlap: int | None = None  # default: min(32, a quarter of the window)

    def __post_init__(self) -> None:
        if self.window_overlap is None:
            self.window_overlap = default_window_overlap(self.max_seq_len)


@dataclass
class Packed:
    """The ids of one encoding, compact; duck-types Encoding for processing.padding."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray

    @classmethod
    def of(cls, encoding) -> Packed:
        return cls(encoding.input_ids.astype(np.int32), encoding.token_type_ids.astype(np.int8))

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class FeatureSet:
    """What a dataset split turns into: per-feature dicts plus what metrics need to map back."""

    items: list[dict[str, Any]]
    lengths: np.ndarray
    examples: list = field(default_factory=list)
    extra: list = field(default_factory=list)  # per example: QAInput / NER windows

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


def make_feature_set(items: list[dict[str, Any]], examples: list, extra: list | None = None) -> FeatureSet:
    lengths = np.array([item["length"] for item in items], dtype=np.int64)
    return FeatureSet(items, lengths, examples, extra or [])


# ----------------------------------------------------------------------------- labels and splits


def label_list(values: list[str]) -> list[str]:
    """Sorted label names; numerically when they are all integers ("0" < "2" < "10")."""
    unique = sorted(set(values))
    if all(v.lstrip("-").isdigit() for v in unique):
        return sorted(unique, key=int)
    return unique


def ner_label_list(tags: list[str]) -> list[str]:
    """O first, then by entity type with B- before I-."""
    unique = set(tags) - {"O"}
    return ["O", *sorted(unique, key=lambda t: (t[2:], t[:1]))]


def looks_like_regression(values: list[str]) -> bool:
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        return False
    return any(not n.is_integer() for n in numbers)


# ----------------------------------------------------------------------------- tasks


class Task:
    name = ""

    def __init__(self, tokenizer: TextTokenizer, options: FeatureOptions):
        self.tokenizer = tokenizer
        self.options = options
        self.id2label: dict[int, str] | None = None
        self.problem_type: str | None = None

    def fit_labels(
        self, examples: list, given: list[str] | None = None, base_labels: list[str] | None = None
    ) -> None:
        """Fix the label vocabulary: `given`, else the base checkpoint's when it covers the data
        (so a fine-tuned head keeps its meaning), else the training data's."""

    def features(self, examples: list, train: bool) -> FeatureSet:
        raise NotImplementedError

    def collate(self, items: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def row_outputs(self, output, batch: dict[str, np.ndarray]) -> list:
        """Per-row numpy outputs of one eval batch, trimmed to each row's length."""
        logits = output.logits.float().cpu().numpy()
        return list(logits)

    def metrics(self, data: FeatureSet, outputs: list) -> dict[str, float]:
        raise NotImplementedError

    def pad(self, items: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        return pad_batch([item["enc"] for item in items], pad_id=self.tokenizer.pad_id)

    def step_stats(self, output, batch: dict[str, Any], micro_batches: int) -> dict[str, float]:
        """What to log of one training micro-batch beyond its loss, summed over the step's
        `micro_batches` (the trainer knows no task's outputs)."""
        return {}

    def step_scalars(self, stats: dict[str, float]) -> dict[str, float]:
        """TensorBoard scalars (train/<name>) from one step's summed `step_stats`."""
        return {}


class ClassifyTask(Task):
    name = "classify"
    soft_labels: dict | None = None  # (text, pair) -> a teacher's logits (train.distill)

    def fit_labels(
        self,
        examples: list[ClassifyExample],
        given: list[str] | None = None,
        base_labels: list[str] | None = None,
    ) -> None:
        values = [e.label for e in examples if e.label is not None]
        if not values:
            raise ValueError("the classification training data has no labels")
        if given == ["regression"] or (given is None and looks_like_regression(values)):
            self.id2label, self.problem_type = {0: "score"}, "regression"
            return
        if given is None and base_labels and set(values) <= set(base_labels):
            given = base_labels
        self.id2label = dict(enumerate(given or label_list(values)))
        self.problem_type = "single_label_classification"

    @property
    def regression(self) -> bool:
        return self.problem_type == "regression"

    def label_value(self, label: str | None) -> float | int:
        if label is None:
            raise ValueError("an example without a label cannot be used for training or evaluation")
        if self.regression:
            return float(label)
        label2id = {v: k for k, v in self.id2label.items()}
        if label not in label2id:
            raise ValueError(f"label {label!r} is not among the training labels {list(label2id)}")
        return label2id[label]

    def features(self, examples: list[ClassifyExample], train: bool) -> FeatureSet:
        items = []
        o = self.options
        for doc, e in enumerate(examples):
            teacher = self.soft_labels[(e.text, e.text_pair)] if train and self.soft_labels else None
            # A transfer text (train.distill) has no label: the teacher's logits are all it learns.
            label = IGNORE if teacher is not None and e.label is None else self.label_value(e.label)
            encodings = pclassify.encode_for_classify(
                self.tokenizer, e.text, e.text_pair, o.max_seq_len, o.long_text, o.window_overlap
            )
            for enc in encodings:
                item = {"enc": Packed.of(enc), "label": label, "doc": doc, "length": len(enc)}
                items.append(item if teacher is None else {**item, "teacher": teacher})
        return make_feature_set(items, examples)

    def collate(self, items):
        batch = self.pad(items)
        dtype = np.float32 if self.regression else np.int64
        batch["labels"] = np.array([item["label"] for item in items], dtype=dtype)
        if "teacher" in items[0]:  # training with soft labels (train.distill)
            batch["teacher_logits"] = np.stack([item["teacher"] for item in items])
        return batch

    def metrics(self, data: FeatureSet, outputs: list) -> dict[str, float]:
        per_doc: dict[int, list[np.ndarray]] = {}
        for item, logits in zip(data.items, outputs, strict=True):
            per_doc.setdefault(item["doc"], []).append(logits)
        labels = [self.id2label[i] for i in range(len(self.id2label))]
        results = [
            pclassify.classify_from_logits(np.stack(per_doc[d]), labels, self.regression)
            for d in range(len(data.examples))
        ]
        gold = [self.label_value(e.label) for e in data.examples]
        if self.regression:
            values = [r.value for r in results]
            p, s = pearson(values, gold), spearman(values, gold)
            return {"pearson": p, "spearman": s, "corr": (p + s) / 2}
        label2id = {v: k for k, v in self.id2label.items()}
        predicted = [label2id[r.label] for r in results]
        return {"accuracy": accuracy(predicted, gold), "f1": f1_score(predicted, gold, len(labels))}


class NERTask(Task):
    name = "ner"

    def fit_labels(
        self, examples: list[NERExample], given: list[str] | None = None, base_labels: list[str] | None = None
    ) -> None:
        tags = [t for e in examples for t in e.tags]
        if given is None and base_labels and set(tags) <= set(base_labels):
            given = base_labels
        self.id2label = dict(enumerate(given or ner_label_list(tags)))

    def features(self, examples: list[NERExample], train: bool) -> FeatureSet:
        label2id = {v: k for k, v in self.id2label.items()}
        items, extra = [], []
        for index, e in enumerate(examples):
            unknown = sorted(set(e.tags) - set(label2id))
            if unknown:
                raise ValueError(f"NER tags {unknown} are not among the training labels {list(label2id)}")
            tokens = self.tokenizer.tokenize_words(e.words)
            windows = pner.make_windows(
                self.tokenizer, tokens, self.options.max_seq_len, self.options.window_overlap
            )
            word_labels = [label2id[t] for t in e.tags]
            for w, window in enumerate(windows):
                labels = pner.align_labels(window.encoding.word_ids, word_labels)
                items.append(
                    {
                        "enc": Packed.of(window.encoding),
                        "labels": labels,
                        "example": index,
                        "window": w,
                        "length": len(window.encoding),
                    }
                )
            if not train:
                extra.append((tokens, windows))
        return make_feature_set(items, examples, extra)

    def collate(self, items):
        batch = self.pad(items)
        labels = np.full(batch["input_ids"].shape, IGNORE, dtype=np.int64)
        for row, item in enumerate(items):
            labels[row, : len(item["labels"])] = item["labels"]
        batch["labels"] = labels
        return batch

    def row_outputs(self, output, batch):
        logits = output.logits.float().cpu().numpy()
        lengths = batch["attention_mask"].sum(axis=1)
        return [row[:n] for row, n in zip(logits, lengths, strict=True)]

    def predicted_tags(self, tokens, windows, window_logits: list[np.ndarray], n_words: int) -> list[str]:
        merged = pner.merge_window_logits(len(tokens), windows, window_logits)
        per_word = pner.word_predictions(tokens.word_ids, merged, "first") if len(tokens) else {}
        # A word the tokenizer drops entirely (e.g. a control character) is predicted O.
        return [self.id2label[int(np.argmax(per_word[w]))] if w in per_word else "O" for w in range(n_words)]

    def metrics(self, data: FeatureSet, outputs: list) -> dict[str, float]:
        per_example: dict[int, list[np.ndarray]] = {}
        for item, logits in zip(data.items, outputs, strict=True):
            per_example.setdefault(item["example"], []).append(logits)
        predicted = []
        for index, (e, (tokens, windows)) in enumerate(zip(data.examples, data.extra, strict=True)):
            predicted.append(self.predicted_tags(tokens, windows, per_example.get(index, []), len(e.words)))
        gold = [e.tags for e in data.examples]
        scores = entity_scores(gold, predicted)
        flat_gold = [t for tags in gold for t in tags]
        flat_pred = [t for tags in predicted for t in tags]
        scores["token_accuracy"] = float(np.mean([g == p for g, p in zip(flat_gold, flat_pred, strict=True)]))
        return scores


class ChoiceTask(Task):
    name = "multiple-choice"

    def features(self, examples: list[ChoiceExample], train: bool) -> FeatureSet:
        items = []
        n_choices = {len(e.choices) for e in examples}
        if len(n_choices) > 1:
            raise ValueError(f"every question needs the same number of choices, got {sorted(n_choices)}")
        for e in examples:
            if e.label is None:
                raise ValueError("a multiple-choice example without a label cannot be used here")
            encodings = encode_choices(
                self.tokenizer, e.context, e.question, e.choices, self.options.max_seq_len
            )
            packed = [Packed.of(enc) for enc in encodings]
            items.append({"encs": packed, "label": e.label, "length": max(len(p) for p in packed)})
        return make_feature_set(items, examples)

    def collate(self, items):
        batch = pad_choices([item["encs"] for item in items], pad_id=self.tokenizer.pad_id)
        batch["labels"] = np.array([item["label"] for item in items], dtype=np.int64)
        return batch

    def metrics(self, data: FeatureSet, outputs: list) -> dict[str, float]:
        predicted = [int(np.argmax(o)) for o in outputs]
        return {"accuracy": accuracy(predicted, [item["label"] for item in data.items])}


def training_answer(answers: list[tuple[str, int]]) -> tuple[str, int]:
    """The span most annotators gave (SQuAD dev has about three per question); ties go to the first."""
    counts: dict[tuple[str, int], int] = {}
    for answer in answers:
        counts[answer] = counts.get(answer, 0) + 1
    return max(counts, key=counts.__getitem__)


class QATask(Task):
    name = "qa"

    def features(self, examples: list[QAExample], train: bool) -> FeatureSet:
        o = self.options
        items, extra = [], []
        for index, e in enumerate(examples):
            qa_input = pqa.make_windows(
                self.tokenizer, e.question, e.context, o.max_seq_len, o.doc_stride, o.max_query_len
            )
            span = None
            if e.answers and not e.is_impossible:
                text, start = training_answer(e.answers)
                span = pqa.char_to_token_span(qa_input.context_tokens, start, start + len(text))
            for w, window in enumerate(qa_input.windows):
                start_pos, end_pos = pqa.training_positions(qa_input, window, span)
                items.append(
                    {
                        "enc": Packed.of(window.encoding),
                        "start": start_pos,
                        "end": end_pos,
                        "example": index,
                        "window": w,
                        "length": len(window.encoding),
                    }
                )
            if not train:
                extra.append(qa_input)
        return make_feature_set(items, examples, extra)

    def collate(self, items):
        batch = self.pad(items)
        batch["start_positions"] = np.array([item["start"] for item in items], dtype=np.int64)
        batch["end_positions"] = np.array([item["end"] for item in items], dtype=np.int64)
        return batch

    def row_outputs(self, output, batch):
        starts = output.start_logits.float().cpu().numpy()
        ends = output.end_logits.float().cpu().numpy()
        lengths = batch["attention_mask"].sum(axis=1)
        return [(s[:n], e[:n]) for s, e, n in zip(starts, ends, lengths, strict=True)]

    def metrics(self, data: FeatureSet, outputs: list) -> dict[str, float]:
        per_example: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for item, logits in zip(data.items, outputs, strict=True):
            per_example.setdefault(item["example"], []).append(logits)
        v2 = any(e.is_impossible for e in data.examples)
        predictions, gold = {}, {}
        for index, (e, qa_input) in enumerate(zip(data.examples, data.extra, strict=True)):
            logits = per_example[index]
            answers = pqa.best_answers(
                qa_input,
                [s for s, _ in logits],
                [t for _, t in logits],
                top_k=1,
                max_answer_len=self.options.max_answer_len,
                handle_impossible_answer=v2,
            )
            predictions[e.id] = answers[0].text if answers else ""
            gold[e.id] = [] if e.is_impossible else [text for text, _ in e.answers]
        return squad_scores(predictions, gold)


class PretrainTask(Task):
    """MLM + NSP; the dataset (train.pretrain_data) already yields padded-ready items."""

    name = "pretrain"

    def collate(self, items):
        from .pretrain_data import collate_pretrain

        return collate_pretrain(items, pad_id=self.tokenizer.pad_id)

    def row_outputs(self, output, batch):
        import torch

        from .pretrain_data import masked_hits

        labels = torch.as_tensor(batch["labels"]).cpu()
        right, masked = masked_hits(output.prediction_logits.cpu(), labels)
        nsp_labels = torch.as_tensor(batch["next_sentence_label"]).cpu().view(-1)
        nsp = output.seq_relationship_logits.cpu().argmax(-1) == nsp_labels
        return [(int(r), int(m), int(n)) for r, m, n in zip(right, masked, nsp, strict=True)]

    def metrics(self, data, outputs: list) -> dict[str, float]:
        correct, total, nsp = (sum(column) for column in zip(*outputs, strict=True))
        return {"mlm_accuracy": correct / max(total, 1), "nsp_accuracy": nsp / max(len(outputs), 1)}

    def step_stats(self, output, batch, micro_batches: int) -> dict[str, float]:
        from .pretrain_data import mlm_nsp_accuracy

        counts = mlm_nsp_accuracy(
            output.prediction_logits,
            batch["labels"],
            output.seq_relationship_logits,
            batch["next_sentence_label"],
        )
        stats = {key: counts[key] for key in ("mlm_correct", "mlm_total", "nsp_correct", "nsp_total")}
        for name in ("mlm_loss", "nsp_loss"):
            stats[name] = float(getattr(output, name).detach()) / micro_batches
        return stats

    def step_scalars(self, stats: dict[str, float]) -> dict[str, float]:
        scalars = {name: stats[name] for name in ("mlm_loss", "nsp_loss")}
        if stats["mlm_total"]:
            scalars["mlm_accuracy"] = stats["mlm_correct"] / stats["mlm_total"]
            scalars["nsp_accuracy"] = stats["nsp_correct"] / stats["nsp_total"]
        return scalars


# Each trained task's features and metrics, by task name (pretrain: training only, never served).
TASK_FEATURES: dict[str, type[Task]] = {
    "classify": ClassifyTask,
    "ner": NERTask,
    "multiple-choice": ChoiceTask,
    "qa": QATask,
    "pretrain": PretrainTask,
}
