"""The task registry: every task the project serves, declared once, as plain data.

Torch-free and HTTP-free, so every side reads it: the service (settings, routes, middleware,
services), export (bundle inputs/outputs, heads by architecture name), and training (metrics).
Per-side tables keyed by task name (model.bert.TASK_HEADS, app.services.SERVICES,
train.features.TASKS, train.readers.FORMATS) are checked against it by tests/test_tasks.py.

Adding a task: declare it here, then write its pre/post-processing (processing/<task>.py),
its head (model/bert.py), its service and schemas (app/), its feature class (train/features.py)
and a reader; README "Adding a task" lists the places.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    name: str
    path: str  # the HTTP route
    summary: str  # the route's one-line description in /docs
    request: str  # app.schemas class names
    responses: tuple[str, ...]  # more than one: the route answers their union (e.g. one text or a batch)
    head: str  # model.bert class, also the `architectures` entry of a transformers config.json
    metric: str  # the validation metric that picks the best checkpoint
    token_axes: tuple[str, ...]  # the symbolic shape of input_ids, attention_mask, token_type_ids
    outputs: tuple[tuple[str, tuple[str, ...]], ...]  # graph outputs: name, symbolic shape ("labels" = n)

    @property
    def choices(self) -> bool:
        """Inputs grouped per example ([batch, choices, sequence]), not one row per example."""
        return "choices" in self.token_axes

    @property
    def labelled(self) -> bool:
        """Outputs score a label set the bundle names (its `labels`)."""
        return any("labels" in axes for _, axes in self.outputs)

    @property
    def per_token(self) -> bool:
        """Outputs have a value per token (compared on real tokens only, never on padding)."""
        return any("sequence" in axes for _, axes in self.outputs)

    def output_shapes(self, num_labels: int | None = None) -> dict[str, list[str | int]]:
        labels: str | int = num_labels if num_labels is not None else "labels"
        return {name: [labels if axis == "labels" else axis for axis in axes] for name, axes in self.outputs}


TOKENS = ("batch", "sequence")
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            name="classify",
            path="/classify",
            summary="Classify a text, a text pair, or a batch",
            request="ClassifyRequest",
            responses=("ClassifyResult", "ClassifyBatchResponse"),
            head="BertForSequenceClassification",
            metric="accuracy",
            token_axes=TOKENS,
            outputs=(("logits", ("batch", "labels")),),
        ),
        TaskSpec(
            name="ner",
            path="/ner",
            summary="Named entities with character offsets",
            request="NERRequest",
            responses=("NERResponse",),
            head="BertForTokenClassification",
            metric="f1",
            token_axes=TOKENS,
            outputs=(("logits", ("batch", "sequence", "labels")),),
        ),
        TaskSpec(
            name="multiple-choice",
            path="/multiple-choice",
            summary="Pick the best of several choices",
            request="ChoiceRequest",
            responses=("ChoiceResponse",),
            head="BertForMultipleChoice",
            metric="accuracy",
            token_axes=("batch", "choices", "sequence"),
            outputs=(("logits", ("batch", "choices")),),
        ),
        TaskSpec(
            name="qa",
            path="/qa",
            summary="Extractive question answering over a context of any length",
            request="QARequest",
            responses=("QAResponse",),
            head="BertForQuestionAnswering",
            metric="f1",
            token_axes=TOKENS,
            outputs=(("start_logits", TOKENS), ("end_logits", TOKENS)),
        ),
    )
}
TASK_NAMES: tuple[str, ...] = tuple(TASKS)
TASK_PATHS: dict[str, str] = {spec.path: spec.name for spec in TASKS.values()}
