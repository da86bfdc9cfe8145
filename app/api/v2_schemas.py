"""The Open Inference Protocol's JSON objects (KServe V2; Triton's HTTP/REST API), as the
specification names their fields. Tensor data are JSON arrays, nested or flat, in row-major order, or
binary after the JSON (Triton's binary tensor data extension: app/api/v2_binary.py)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from app.api.native_schemas import Strict

Scalar = str | int | float | bool  # a parameter's value
Parameters = dict[str, Scalar]


class V2InputTensor(Strict):
    name: str
    shape: list[Annotated[int, Field(ge=0)]]
    datatype: str = Field(description="BYTES for text: each element a JSON string")
    parameters: Parameters | None = Field(
        None, description="binary_data_size: the tensor's data is that many bytes after the JSON header"
    )
    data: list[Any] | None = Field(None, description="Absent when the data is binary")


class V2RequestedOutput(Strict):
    name: str
    parameters: Parameters | None = None


class V2InferRequest(Strict):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "id": "42",
                    "inputs": [
                        {
                            "name": "text",
                            "shape": [2],
                            "datatype": "BYTES",
                            "data": ["a wonderful film", "a dull, lifeless film"],
                        }
                    ],
                    "outputs": [{"name": "label"}, {"name": "score"}],
                }
            ]
        },
    )
    id: str | None = Field(None, description="Returned in the response")
    parameters: Parameters | None = Field(
        None, description="The task's options (top_k, aggregation, ...) and timeout_ms / priority"
    )
    inputs: list[V2InputTensor] = Field(min_length=1)
    outputs: list[V2RequestedOutput] | None = Field(None, description="Default: every output")


class V2OutputTensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None  # binary_data_size, for an output sent as binary
    data: list[Any] | None = None


class V2InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[V2OutputTensor]


class V2TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1: any size; the first axis is the batch")


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[V2TensorMetadata]
    outputs: list[V2TensorMetadata]


class V2ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class V2Live(BaseModel):
    live: bool


class V2Ready(BaseModel):
    ready: bool


class V2ModelReady(BaseModel):
    name: str
    ready: bool


class V2ErrorResponse(BaseModel):
    """Every error under /v2, as the specification has it (the status says which kind)."""

    error: str = Field(description="What was wrong, naming the input, output or parameter")
