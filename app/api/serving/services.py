"""Per-task services: encode with processing/, submit work items to the batcher, post-process.

All task logic (windows, packing, aggregation, answer search) lives in processing/; this
module only checks service limits, moves data between the two and measures the stages.
CPU-bound steps run in worker threads so the event loop stays responsive.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel

from app.api.native_schemas import (
    AnswerOut,
    ChoiceRequest,
    ChoiceResponse,
    ClassifyBatchResponse,
    ClassifyRequest,
    ClassifyResult,
    EntityOut,
    LabelScore,
    NERRequest,
    NERResponse,
    QARequest,
    QAResponse,
)
from app.api.service_schemas import TokenizeRequest, TokenOut
from app.api.serving.embed_service import EmbedService
from app.api.serving.sparse_service import SparseEmbedService
from app.api.serving.task_service import (
    ModelVersion,
    TaskService,
    Timings,
    check_chars,
    check_items,
    cpu_step,
    sequence_items,
)
from app.api.tei_schemas import EmbedRequest, EmbedResponse, EmbedTextsRequest, SparseEmbedResponse
from app.engine.protocol import EngineClient, Item, ItemOutput
from app.errors import InputTooLong, InvalidInput, TooManyChoices
from app.settings import Settings
from export.bundle import DEFAULT_QA
from processing import choice as choice_proc
from processing import classify as classify_proc
from processing import ner as ner_proc
from processing import qa as qa_proc
from processing.tokenizer import Encoding
from processing.words import LEGACY_WORD_SPLIT

T = TypeVar("T")
log = logging.getLogger("app.services")


Pair = tuple[str, str | None]  # a text and its optional second segment
Names = tuple[str, str]  # the request fields they came from, for errors ("inputs.3.text", "texts.3")


@dataclass
class Classified:
    """One input classified: /classify's answer, the logits it came from, what happened to it."""

    result: classify_proc.ClassifyResult
    logits: np.ndarray  # [windows, labels]
    truncated: bool  # cut to max_seq_len
    tokens: int


class ClassifyService(TaskService):
    task = "classify"

    def __init__(self, bundle: ModelVersion, settings: Settings, engine: EngineClient):
        super().__init__(bundle, settings, engine)
        self.regression = self.manifest.problem_type == "regression"
        self.labels = list(self.manifest.labels or [])
        self.long_text = settings.classify_long_text

    def check_count(self, count: int, field: str) -> None:
        check_items(count, self.settings.max_batch_items, field)

    def check_top_k(self, top_k: int | None) -> None:
        n_labels = 1 if self.regression else len(self.labels)
        if top_k is not None and top_k > n_labels:
            raise InvalidInput(f"top_k must be between 1 and {n_labels} (the labels)", "top_k")

    def _validate(self, request: ClassifyRequest) -> tuple[list[Pair], list[Names]]:
        if request.inputs is not None:
            self.check_count(len(request.inputs), "inputs")
            pairs = [(i.text, i.text_pair) for i in request.inputs]
            prefixes = [f"inputs.{n}." for n in range(len(pairs))]
        else:
            assert request.text is not None
            pairs, prefixes = [(request.text, request.text_pair)], [""]
        self.check_top_k(request.top_k)
        return pairs, [(f"{prefix}text", f"{prefix}text_pair") for prefix in prefixes]

    def _encode(
        self, pairs: list[Pair], names: list[Names], truncate: bool | None
    ) -> list[tuple[list[Encoding], bool]]:
        long_text = self.long_text if truncate is None else "truncate"
        out = []
        for (text, pair), (name, pair_name) in zip(pairs, names, strict=True):
            encodings = classify_proc.encode_for_classify(
                self.tokenizer, text, pair, self.max_seq_len, long_text, self.window_overlap
            )
            truncated = len(encodings) == 1 and encodings[0].truncated
            if truncated and truncate is False:  # a pair is named by its second text ("texts.3")
                field, beside = (name, "") if pair is None else (pair_name, f" with {name}")
                tokens = sum(len(self.tokenizer.tokenize(t)) + 1 for t in (text, pair) if t is not None) + 1
                raise InputTooLong(
                    f"{field} has {tokens} tokens{beside} and the model reads at most {self.max_seq_len}: "
                    "send truncate: true to cut it, or leave truncate unset for the server's rule",
                    field,
                )
            out.append((encodings, truncated))
        return out

    async def classify(
        self,
        pairs: list[Pair],
        names: list[Names],
        timings: Timings,
        top_k: int | None = None,
        truncate: bool | None = None,
    ) -> list[Classified]:
        """Every input through the model, as /classify serves it: the one path of TEI's /predict and
        /rerank too. `truncate`: None is CLASSIFY_LONG_TEXT's rule, True cuts, False refuses (413)."""
        for (text, pair), (name, pair_name) in zip(pairs, names, strict=True):
            check_chars(text, self.settings.max_text_chars, name, "MAX_TEXT_CHARS")
            if pair is not None:
                check_chars(pair, self.settings.max_text_chars, pair_name, "MAX_TEXT_CHARS")
        with timings.measure("tokenize"):
            chars = sum(len(text) + len(pair or "") for text, pair in pairs)
            timings.chars += chars
            encoded = await cpu_step(chars, self._encode, pairs, names, truncate)
        items = sequence_items([e for encodings, _ in encoded for e in encodings])
        results = await self.infer(items, timings)
        with timings.measure("postprocess"):
            outputs, cursor = [], 0
            for encodings, truncated in encoded:
                logits = np.stack([r.outputs["logits"] for r in results[cursor : cursor + len(encodings)]])
                cursor += len(encodings)
                result = classify_proc.classify_from_logits(
                    logits, self.labels, regression=self.regression, top_k=top_k
                )
                outputs.append(Classified(result, logits, truncated, sum(map(len, encodings))))
        return outputs

    async def __call__(
        self, request: ClassifyRequest, timings: Timings
    ) -> ClassifyResult | ClassifyBatchResponse:
        pairs, names = self._validate(request)
        done = await self.classify(pairs, names, timings, top_k=request.top_k)
        with timings.measure("postprocess"):
            outputs = [
                ClassifyResult(
                    label=c.result.label,
                    score=c.result.score,
                    value=c.result.value,
                    truncated=c.truncated,
                    windows=c.result.windows,
                    scores=[LabelScore(label=s.label, score=s.score) for s in c.result.scores],
                )
                for c in done
            ]
        return outputs[0] if request.inputs is None else ClassifyBatchResponse(results=outputs)


class NERService(TaskService):
    task = "ner"

    def __init__(self, bundle: ModelVersion, settings: Settings, engine: EngineClient):
        super().__init__(bundle, settings, engine)
        self.id2label = dict(enumerate(self.manifest.labels or []))
        self.word_split = self.manifest.preprocessing.get("word_split")
        if self.word_split is None:
            self.word_split = LEGACY_WORD_SPLIT
            log.info(
                "bundle %s records no word_split (exported before it was recorded): entities are "
                "built over %r words, the rule its training used",
                self.manifest.name,
                self.word_split,
            )

    def _encode(self, text: str) -> tuple[Any, list[ner_proc.NERWindow]]:
        tokens = ner_proc.tokenize_text(self.tokenizer, text, self.word_split)
        return tokens, ner_proc.make_windows(self.tokenizer, tokens, self.max_seq_len, self.window_overlap)

    async def __call__(self, request: NERRequest, timings: Timings) -> NERResponse:
        check_chars(request.text, self.settings.max_text_chars, "text", "MAX_TEXT_CHARS")
        timings.chars += len(request.text)
        with timings.measure("tokenize"):
            tokens, windows = await cpu_step(len(request.text), self._encode, request.text)
        results = await self.infer(sequence_items([w.encoding for w in windows]), timings)
        with timings.measure("postprocess"):
            entities = await cpu_step(len(request.text), self._entities, request, tokens, windows, results)
        return NERResponse(entities=entities, windows=len(windows))

    def _entities(
        self, request: NERRequest, tokens: Any, windows: list, results: list[ItemOutput]
    ) -> list[EntityOut]:
        logits = ner_proc.merge_window_logits(len(tokens), windows, [r.outputs["logits"] for r in results])
        found = ner_proc.aggregate_entities(request.text, tokens, logits, self.id2label, request.aggregation)
        return [
            EntityOut(entity=e.entity, text=e.text, start=e.start, end=e.end, score=e.score) for e in found
        ]


class ChoiceService(TaskService):
    task = "multiple-choice"

    async def __call__(self, request: ChoiceRequest, timings: Timings) -> ChoiceResponse:
        limit = self.settings.max_choices
        if len(request.choices) > limit:
            raise TooManyChoices(
                f"choices has {len(request.choices)} items; the limit is {limit} (MAX_CHOICES)",
                "choices",
            )
        check_chars(request.context, self.settings.max_text_chars, "context", "MAX_TEXT_CHARS")
        if request.question is not None:
            check_chars(request.question, self.settings.max_text_chars, "question", "MAX_TEXT_CHARS")
        for n, option in enumerate(request.choices):
            check_chars(option, self.settings.max_text_chars, f"choices.{n}", "MAX_TEXT_CHARS")
        with timings.measure("tokenize"):
            chars = len(request.context) + len(request.question or "") + sum(map(len, request.choices))
            timings.chars += chars
            encodings = await cpu_step(
                chars,
                choice_proc.encode_choices,
                self.tokenizer,
                request.context,
                request.question,
                request.choices,
                self.max_seq_len,
            )
        # One [choices, seq] group per request; only groups with as many choices share a batch.
        (result,) = await self.infer([Item.of(encodings)], timings, grouped=True)
        with timings.measure("postprocess"):
            picked = choice_proc.choice_from_logits(result.outputs["logits"], request.choices)
        return ChoiceResponse(best=picked.best, choice=picked.choice, scores=picked.scores)


class QAService(TaskService):
    task = "qa"

    def __init__(self, bundle: ModelVersion, settings: Settings, engine: EngineClient):
        super().__init__(bundle, settings, engine)
        defaults = {**DEFAULT_QA, **(self.manifest.qa_defaults or {})}
        self.max_query_len = int(defaults["max_query_len"])
        self.max_answer_len = int(defaults["max_answer_len"])
        # The bundle's stride must fit the smallest window (longest question) or every request fails.
        smallest_window = qa_proc.window_capacity(self.max_seq_len, self.max_query_len)
        self.doc_stride = max(0, min(int(defaults["doc_stride"]), smallest_window // 2))

    async def __call__(self, request: QARequest, timings: Timings) -> QAResponse:
        check_chars(request.question, self.settings.max_text_chars, "question", "MAX_TEXT_CHARS")
        check_chars(request.context, self.settings.max_qa_context_chars, "context", "MAX_QA_CONTEXT_CHARS")
        stride = self.doc_stride if request.doc_stride is None else request.doc_stride
        timings.chars += len(request.context) + len(request.question)
        with timings.measure("tokenize"):
            try:
                qa_input = await cpu_step(
                    len(request.context) + len(request.question),
                    qa_proc.make_windows,
                    self.tokenizer,
                    request.question,
                    request.context,
                    self.max_seq_len,
                    stride,
                    self.max_query_len,
                )
            except ValueError as e:  # the stride does not fit this question's window
                raise InvalidInput(str(e), "doc_stride") from None
        results = await self.infer(sequence_items([w.encoding for w in qa_input.windows]), timings)
        with timings.measure("postprocess"):
            answers = await cpu_step(
                len(request.context),
                qa_proc.best_answers,
                qa_input,
                [r.outputs["start_logits"] for r in results],
                [r.outputs["end_logits"] for r in results],
                top_k=request.top_k,
                n_best=max(20, request.top_k),
                max_answer_len=request.max_answer_len or self.max_answer_len,
                handle_impossible_answer=request.handle_impossible_answer,
            )
        return QAResponse(
            answers=[AnswerOut(text=a.text, start=a.start, end=a.end, score=a.score) for a in answers],
            windows=len(qa_input.windows),
        )


async def tokenize_texts(
    bundle: ModelVersion, request: TokenizeRequest, settings: Settings
) -> list[list[TokenOut]]:
    """/tokenize: every text's tokens with their offsets, from the model's own tokenizer."""
    assert bundle.tokenizer is not None
    texts = request.texts
    check_items(len(texts), settings.max_batch_items, "inputs")
    for n, text in enumerate(texts):
        field = "inputs" if isinstance(request.inputs, str) else f"inputs.{n}"
        check_chars(text, settings.max_text_chars, field, "MAX_TEXT_CHARS")

    def spans() -> list[list[TokenOut]]:
        assert bundle.tokenizer is not None
        return [
            [
                TokenOut(**vars(span))
                for span in bundle.tokenizer.token_spans(text, request.add_special_tokens)
            ]
            for text in texts
        ]

    return await cpu_step(sum(map(len, texts)), spans)


@dataclass(frozen=True)
class TaskSchemas:
    """A task's wire types on its native route: the request, and the answers (more than one: the route
    answers their union, e.g. one text or a batch)."""

    request: type[BaseModel]
    responses: tuple[type[BaseModel], ...]


TASK_SCHEMAS: dict[str, TaskSchemas] = {
    "classify": TaskSchemas(ClassifyRequest, (ClassifyResult, ClassifyBatchResponse)),
    "ner": TaskSchemas(NERRequest, (NERResponse,)),
    "multiple-choice": TaskSchemas(ChoiceRequest, (ChoiceResponse,)),
    "qa": TaskSchemas(QARequest, (QAResponse,)),
    "embed": TaskSchemas(EmbedRequest, (EmbedResponse,)),
    "sparse": TaskSchemas(EmbedTextsRequest, (SparseEmbedResponse,)),
}


SERVICES: dict[str, type[TaskService]] = {
    "classify": ClassifyService,
    "ner": NERService,
    "multiple-choice": ChoiceService,
    "qa": QAService,
    "embed": EmbedService,
    "sparse": SparseEmbedService,
}


def make_service(bundle: ModelVersion, settings: Settings, engine: EngineClient) -> TaskService:
    assert bundle.task is not None
    return SERVICES[bundle.task](bundle, settings, engine)


S = TypeVar("S", bound=TaskService)


def service_of(bundle: ModelVersion, kind: type[S]) -> S:
    """The bundle's service as the route's type: a route for one task gets that task's service."""
    service = bundle.service
    if not isinstance(service, kind):  # the registry leases by task, so this is a bug if it happens
        raise TypeError(f"model {bundle.name} serves {type(service).__name__}, not {kind.__name__}")
    return service
