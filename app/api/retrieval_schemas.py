"""TEI's retrieval outputs: /embed_sparse (SPLADE term weights) and /embed_all (a vector per token),
their request and answers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, RootModel

from app.api.schemas import EmbedOptions, Texts


class EmbedTextsRequest(EmbedOptions):
    """TEI's /embed_sparse and /embed_all."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    inputs: Texts = Field(description="One text, or a list of texts")


class SparseValue(BaseModel):
    index: int = Field(description="The vocabulary id (the tokenizer's) the weight belongs to")
    value: float = Field(description="Its weight: the maximum over the text's tokens of log(1 + relu(logit))")


class SparseEmbedResponse(RootModel[list[list[SparseValue]]]):
    """Per input, in order, its nonzero weights by increasing index (TEI's shape)."""


class EmbedAllResponse(RootModel[list[list[list[float]]]]):
    """Per input, one vector per token the model read (special tokens included), in order: the
    encoder's last hidden states, for late interaction (ColBERT-style scoring)."""
