"""The answers of TEI's retrieval outputs: /embed_sparse (SPLADE term weights) and /embed_all (a
vector per token). Their request is app.http.schemas.EmbedTextsRequest."""

from __future__ import annotations

from pydantic import BaseModel, Field, PrivateAttr, RootModel


class SparseValue(BaseModel):
    index: int = Field(description="The vocabulary id (the tokenizer's) the weight belongs to")
    value: float = Field(description="Its weight: the maximum over the text's tokens of log(1 + relu(logit))")


class SparseEmbedResponse(RootModel[list[list[SparseValue]]]):
    """Per input, in order, its nonzero weights by increasing index (TEI's shape)."""

    _headers: dict[str, str] = PrivateAttr(default_factory=dict)


class EmbedAllResponse(RootModel[list[list[list[float]]]]):
    """Per input, one vector per token the model read (special tokens included), in order: the
    encoder's last hidden states, for late interaction (ColBERT-style scoring)."""

    _headers: dict[str, str] = PrivateAttr(default_factory=dict)
