"""Infinity's /v1/rerank (Cohere's request shape), onto the classify service
(app/api/serving/rerank_service.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, WithJsonSchema

from app.api.native_schemas import ModelName, Request, Text, _bounded_int
from app.api.openai_schemas import EmbeddingUsage
from app.engine.repository import MODEL_NAME

TopN = _bounded_int(1)


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
