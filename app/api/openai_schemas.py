"""OpenAI's requests and answers: /v1/embeddings (EmbedService) and /v1/models."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.api.native_schemas import _bounded_int
from app.api.tei_schemas import EmbedOptions, Texts

Dimensions = _bounded_int(1)


class OpenAIEmbeddingRequest(EmbedOptions):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={"examples": [{"input": ["What is deep learning?", "A cat sat on the mat."]}]},
    )
    input: Texts = Field(description="One text, or a list of texts (token-id arrays are refused)")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector's float32 values, little-endian, base64-encoded"
    )
    dimensions: Dimensions | None = Field(
        None, description="Must equal the model's width if given: vectors are not shortened"
    )
    user: str | None = Field(None, description="Accepted and ignored")


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int = Field(description="Tokens the model read, [CLS] and [SEP] included")
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class OpenAIModel(BaseModel):
    id: str = Field(description="The name to send as `model`")
    object: Literal["model"] = "model"
    created: int = Field(description="When the serving version was exported (Unix time; 0 if unknown)")
    owned_by: str = "bert-serving"


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]
