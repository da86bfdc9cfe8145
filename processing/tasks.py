"""The task registry: every task the project serves, declared once, as plain data.

Torch-free and HTTP-free, so every side reads it: the service (settings, routes, middleware,
services), export (bundle inputs/outputs, heads by architecture name), and training (metrics).
Per-side tables keyed by task name (model.bert.TASK_HEADS, app.services.SERVICES,
train.features.TASK_FEATURES, train.readers.FORMATS) are checked against it by tests/test_tasks.py.

Adding a task: declare it here, then write its pre/post-processing (processing/<task>.py),
its head (model/bert.py), its service and schemas (app/api/: TASK_SCHEMAS names them), and,
if it is trained here (`trained=True`), its feature class (train/features.py) and a reader;
README "Adding a task" lists the places.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tensor:
    """One named tensor of a task's KServe V2 / Open Inference Protocol interface (app/api/v2.py).

    The first axis is always the batch: row i of every input makes the i-th native request, and
    its native answer makes row i of every output. An input fills the request field of its name;
    an output reads `field` of the answer (a dotted path, `answers.0.text`; default: its name).
    """

    name: str
    datatype: str  # BYTES: text, or JSON where the value is not a string; FP32, INT64, BOOL
    shape: tuple[int, ...]  # -1: any size
    field: str = ""
    optional: bool = False  # an input the request may leave out; an output sent only when asked for
    method: str = ""  # an output another method of the task's service answers (default: the service itself)

    @property
    def path(self) -> tuple[str, ...]:
        return tuple((self.field or self.name).split("."))


@dataclass(frozen=True)
class V2:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


ROW = (-1,)  # one value per batch row


@dataclass(frozen=True)
class TaskSpec:
    name: str
    path: str  # the HTTP route
    summary: str  # the route's one-line description in /docs
    head: str  # model.bert class, also the `architectures` entry of a transformers config.json
    metric: str | None  # the validation metric that picks the best checkpoint (None: not trained here)
    token_axes: tuple[str, ...]  # the symbolic shape of input_ids, attention_mask, token_type_ids
    # Graph outputs: name, shape. "labels" and "hidden" are fixed by the model (label count, hidden
    # size); every other axis is symbolic.
    outputs: tuple[tuple[str, tuple[str, ...]], ...]
    v2: V2  # its tensors on /v2/models/{name}/infer
    # Other `architectures` names a checkpoint of this task may carry (a base encoder: BertModel).
    architectures: tuple[str, ...] = ()
    # Fine-tuned by train/ (a reader, features, a metric); False: served as exported, never trained.
    trained: bool = True
    # Other protocols' routes onto this task's service (app/api/routes.py), counted as the task's own.
    protocol_paths: tuple[str, ...] = ()

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

    def output_shapes(self, num_labels: int | None = None, hidden_size: int | None = None) -> dict[str, list]:
        sizes = {"labels": num_labels, "hidden": hidden_size}
        return {
            name: [axis if sizes.get(axis) is None else sizes[axis] for axis in axes]
            for name, axes in self.outputs
        }


TOKENS = ("batch", "sequence")
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            name="classify",
            path="/classify",
            summary="Classify a text, a text pair, or a batch",
            head="BertForSequenceClassification",
            metric="accuracy",
            token_axes=TOKENS,
            outputs=(("logits", ("batch", "labels")),),
            v2=V2(
                inputs=(Tensor("text", "BYTES", ROW), Tensor("text_pair", "BYTES", ROW, optional=True)),
                outputs=(
                    Tensor("label", "BYTES", ROW),
                    Tensor("score", "FP32", ROW),  # the predicted value, for a regression model
                    Tensor("scores", "BYTES", ROW),  # JSON: [{"label", "score"}], best first
                    Tensor("truncated", "BOOL", ROW),
                    Tensor("windows", "INT64", ROW),
                ),
            ),
            protocol_paths=("/rerank", "/v1/rerank", "/predict"),  # TEI's and Infinity's
        ),
        TaskSpec(
            name="ner",
            path="/ner",
            summary="Named entities with character offsets",
            head="BertForTokenClassification",
            metric="f1",
            token_axes=TOKENS,
            outputs=(("logits", ("batch", "sequence", "labels")),),
            v2=V2(
                inputs=(Tensor("text", "BYTES", ROW),),
                outputs=(
                    Tensor("entities", "BYTES", ROW),  # JSON: [{"entity", "text", "start", "end", "score"}]
                    Tensor("windows", "INT64", ROW),
                ),
            ),
        ),
        TaskSpec(
            name="multiple-choice",
            path="/multiple-choice",
            summary="Pick the best of several choices",
            head="BertForMultipleChoice",
            metric="accuracy",
            token_axes=("batch", "choices", "sequence"),
            outputs=(("logits", ("batch", "choices")),),
            v2=V2(
                inputs=(
                    Tensor("context", "BYTES", ROW),
                    Tensor("question", "BYTES", ROW, optional=True),
                    Tensor("choices", "BYTES", (-1, -1)),
                ),
                outputs=(
                    Tensor("best", "INT64", ROW),
                    Tensor("choice", "BYTES", ROW),
                    Tensor("scores", "FP32", (-1, -1)),
                ),
            ),
        ),
        TaskSpec(
            name="qa",
            path="/qa",
            summary="Extractive question answering over a context of any length",
            head="BertForQuestionAnswering",
            metric="f1",
            token_axes=TOKENS,
            outputs=(("start_logits", TOKENS), ("end_logits", TOKENS)),
            v2=V2(
                inputs=(Tensor("question", "BYTES", ROW), Tensor("context", "BYTES", ROW)),
                outputs=(
                    Tensor("answer", "BYTES", ROW, "answers.0.text"),  # the best; "" for no answer
                    Tensor("score", "FP32", ROW, "answers.0.score"),
                    Tensor("start", "INT64", ROW, "answers.0.start"),
                    Tensor("end", "INT64", ROW, "answers.0.end"),
                    Tensor("answers", "BYTES", ROW),  # JSON: all top_k [{"text", "start", "end", "score"}]
                    Tensor("windows", "INT64", ROW),
                ),
            ),
        ),
        TaskSpec(
            name="embed",
            path="/embed",
            summary="Sentence embeddings (text-embeddings-inference's /embed: a bare list of vectors)",
            head="BertForSentenceEmbedding",
            metric=None,
            token_axes=TOKENS,
            # The token states; processing/embed.py pools each row over its own tokens. Against
            # pooling inside the graph that is as fast and bit-identical alone and in any batch
            # (docs/decisions.md).
            outputs=(("last_hidden_state", ("batch", "sequence", "hidden")),),
            # A row's text is the native request's `inputs`; its vector, row 0 of the bare-list answer.
            # `token_embeddings` (asked for by name): /embed_all's JSON [tokens, hidden] per row.
            v2=V2(
                inputs=(Tensor("inputs", "BYTES", ROW),),
                outputs=(
                    Tensor("embedding", "FP32", (-1, -1), "0"),
                    Tensor("token_embeddings", "BYTES", ROW, "0", optional=True, method="embed_all"),
                ),
            ),
            architectures=("BertModel",),  # a base encoder (or sentence-transformers' module 0)
            trained=False,
            protocol_paths=("/v1/embeddings", "/embeddings", "/similarity", "/embed_all"),  # TEI: both
        ),
        TaskSpec(
            name="sparse",
            path="/embed_sparse",
            summary="Sparse (SPLADE) embeddings: each text's nonzero vocabulary weights "
            "(text-embeddings-inference's /embed_sparse)",
            head="BertForSparseEmbedding",
            metric=None,
            token_axes=TOKENS,
            # SPLADE reduced inside the graph (model.bert.splade): a row's weights over the vocabulary,
            # not its (sequence, vocab) logits.
            outputs=(("sparse", ("batch", "vocab")),),
            # A row's text is the native request's `inputs`; its [{"index", "value"}] JSON: answer row 0.
            v2=V2(inputs=(Tensor("inputs", "BYTES", ROW),), outputs=(Tensor("sparse", "BYTES", ROW, "0"),)),
            trained=False,  # exported from a masked-LM checkpoint with --task sparse
        ),
    )
}
MODEL_AXES = ("labels", "hidden")  # output axes whose size the model fixes
TASK_NAMES: tuple[str, ...] = tuple(TASKS)
TRAINED_TASKS: tuple[str, ...] = tuple(name for name, spec in TASKS.items() if spec.trained)
TASK_PATHS: dict[str, str] = {
    path: spec.name for spec in TASKS.values() for path in (spec.path, *spec.protocol_paths)
}
