"""Requests and answers of the routes onto the classify service from other protocols: reranking as
text-embeddings-inference (/rerank) and Infinity (/v1/rerank, Cohere's shape) speak it, and TEI's
/predict. The service side is app/api/serving/rerank_service.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    WithJsonSchema,
)

from app.api.schemas import (
    _TEXT_SCHEMA,
    EmbeddingUsage,
    ModelName,
    Request,
    Text,
    _bounded_int,
    _check_text,
)
from app.engine.repository import MODEL_NAME

TopN = _bounded_int(1)


class PairOptions(Request):
    raw_scores: StrictBool = Field(
        False,
        description="The model's logit (of the positive label) instead of a probability: for a "
        "one-output model its value rather than its sigmoid",
    )
    truncate: StrictBool | None = Field(
        None,
        description="true: cut long inputs to the model's max_seq_len (a pair's longer segment first); "
        "false: refuse them (413, as TEI); unset: the /classify rule (pairs are cut; single texts follow "
        "CLASSIFY_LONG_TEXT)",
    )
    # TEI's field; left is refused: /classify cuts an input from its end (a pair's longer segment first).
    truncation_direction: Literal["right", "Right"] = Field(
        "right", description="Only right: inputs are cut from their end, as /classify cuts them"
    )


# ----------------------------------------------------------------------------- rerank


class RerankRequest(PairOptions):
    """text-embeddings-inference's /rerank."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "query": "What is deep learning?",
                    "texts": ["Deep learning is a kind of machine learning.", "Paris is in France."],
                }
            ]
        },
    )
    query: Text
    texts: list[Text] = Field(min_length=1, description="The texts to rank (at most MAX_BATCH_ITEMS)")
    return_text: StrictBool = Field(False, description="Give each text back beside its score")


class Rank(BaseModel):
    index: int = Field(description="Position in `texts`")
    score: float = Field(description="Relevance to the query (see raw_scores)")
    text: str | None = Field(None, description="The text, with return_text")


class RerankResponse(RootModel[list[Rank]]):
    """The texts by decreasing score (TEI's bare list)."""

    # What happened to long inputs (X-Truncated-Inputs); routes.serve sends them.


# Infinity's own client sends this when the caller names no model.
INFINITY_NO_MODEL = "default/not-specified"
InfinityModelName = Annotated[
    ModelName | None,
    BeforeValidator(lambda value: None if value == INFINITY_NO_MODEL else value),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string", "pattern": MODEL_NAME.pattern}, {"const": INFINITY_NO_MODEL}],
            "description": "The model to rerank with (a name from /models); default: see app/README.md",
        }
    ),
]


class InfinityRerankRequest(Request):
    """Infinity's /v1/rerank (Cohere's request shape)."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "query": "What is deep learning?",
                    "documents": ["Deep learning is a kind of machine learning.", "Paris is in France."],
                    "top_n": 1,
                    "return_documents": True,
                }
            ]
        },
    )
    model: InfinityModelName = None
    query: Text
    documents: list[Text] = Field(min_length=1, description="The documents to rank (at most MAX_BATCH_ITEMS)")
    return_documents: StrictBool = Field(False, description="Give each document back beside its score")
    raw_scores: StrictBool = Field(
        False, description="The model's logit instead of a probability (as /rerank's raw_scores)"
    )
    top_n: TopN | None = Field(None, description="Only the n most relevant (default: all)")


class RerankResult(BaseModel):
    relevance_score: float
    index: int = Field(description="Position in `documents`")
    document: str | None = Field(None, description="The document, with return_documents")


class InfinityRerankResponse(BaseModel):
    object: Literal["rerank"] = "rerank"
    results: list[RerankResult] = Field(description="By decreasing relevance_score")
    model: str
    usage: EmbeddingUsage
    id: str
    created: int = Field(description="Unix time of the answer")
    # What happened to long inputs (X-Truncated-Inputs); routes.serve sends them.


# ----------------------------------------------------------------------------- predict

_SEQUENCE_SCHEMA = {"type": "array", "items": _TEXT_SCHEMA, "minItems": 1, "maxItems": 2}
SHAPES = "a text, a pair [text, text_pair], or a batch of them [[text], [text, text_pair], ...]"


def _check_sequence(value: list[str], where: str) -> None:
    if not 1 <= len(value) <= 2:
        raise ValueError(
            f"{where} has {len(value)} strings: a list of strings is one text [a] or one pair [a, b]"
            + ("; send a batch as a list of lists, [[a], [b, c]]" if where == "inputs" else "")
        )
    for n, text in enumerate(value):
        try:
            _check_text(text)
        except ValueError as e:
            raise ValueError(f"{where}.{n}: {e}") from None


def _check_predict_inputs(value: str | list[str] | list[list[str]]) -> Any:
    if isinstance(value, str):
        _check_text(value)
    elif not value:
        raise ValueError(f"must be {SHAPES}")
    elif isinstance(value[0], str):
        _check_sequence(value, "inputs")  # type: ignore[arg-type]
    else:
        for n, sequence in enumerate(value):
            _check_sequence(sequence, f"inputs.{n}")  # type: ignore[arg-type]
    return value


PredictInputs = Annotated[
    str | list[str] | list[list[str]],
    AfterValidator(_check_predict_inputs),
    WithJsonSchema(
        {
            "anyOf": [
                _TEXT_SCHEMA,
                _SEQUENCE_SCHEMA,
                {"type": "array", "items": _SEQUENCE_SCHEMA, "minItems": 1},
            ],
            "description": SHAPES.capitalize(),
        }
    ),
]


class PredictRequest(PairOptions):
    """text-embeddings-inference's /predict, with the `model` field of every route here."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {"inputs": "this movie was great fun"},
                {"inputs": [["a great film"], ["boring", "a terrible movie"]]},
            ]
        },
    )
    inputs: PredictInputs

    @property
    def batch(self) -> bool:
        return isinstance(self.inputs, list) and isinstance(self.inputs[0], list)

    def sequences(self) -> tuple[list[tuple[str, str | None]], list[tuple[str, str]]]:
        """Each input as (text, text_pair) and the fields they came from, for errors."""
        if isinstance(self.inputs, str):
            return [(self.inputs, None)], [("inputs", "inputs")]
        forms = self.inputs if self.batch else [self.inputs]
        prefixes = [f"inputs.{n}." for n in range(len(forms))] if self.batch else ["inputs."]
        pairs = [(form[0], form[1] if len(form) > 1 else None) for form in forms]
        return pairs, [(f"{prefix}0", f"{prefix}1") for prefix in prefixes]  # type: ignore[misc]


class Prediction(BaseModel):
    score: float = Field(
        description="Probability of the label (raw_scores: its logit; regression: the value)"
    )
    label: str


class PredictResponse(RootModel[list[Prediction] | list[list[Prediction]]]):
    """Every label by decreasing score; for a batch, one such list per input (TEI's bare lists)."""

    # What happened to long inputs (X-Truncated-Inputs, X-Windowed-Inputs); routes.serve sends them.
