"""The service's own requests and answers, beside the tasks': errors, liveness, readiness, /models,
/tokenize, TEI's /decode and /info (app/api/tei_routes.py) and the admin routes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, StrictBool, WithJsonSchema

from app.api.native_schemas import ModelName, Strict, Text


class FieldError(BaseModel):
    field: str
    message: str
    type: str | None = None


class ErrorResponse(BaseModel):
    error: str = Field(description="Machine-readable code, e.g. invalid_request, overloaded")
    message: str
    fields: list[FieldError] | None = None
    request_id: str | None = None


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyResponse(BaseModel):
    ready: bool
    status: str = Field(description="ready | loading | failed | shutting_down")
    models: dict[str, str] = Field(description="Bundle name -> status")
    errors: dict[str, str] = Field(default_factory=dict)


class VersionInfo(BaseModel):
    version: str
    path: str
    status: str = Field(description="loading | serving | retiring | retired | rejected")
    digest: str | None = Field(None, description="First 12 hex digits of the sha256 of its bundle.json")
    error: str | None = None
    at: str = Field(description="When it reached this status (UTC)")


class ModelInfo(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    name: str
    path: str | None = Field(None, description="The serving version's directory")
    task: str | None
    status: str = Field(description="pending | loading | ready | failed | unloading | unloaded")
    error: str | None = None
    default: bool = Field(False, description="Serves requests of its task that name no model")
    rerank_default: bool = Field(
        False, description="Serves /rerank and /v1/rerank requests that name no model"
    )
    version: str | None = Field(None, description="The version serving (X-Model-Version)")
    digest: str | None = None
    memory_mb: float | None = Field(
        None, description="Resident memory its load and warm-up took (RSS growth)"
    )
    in_flight: int = Field(0, description="Requests the serving version is answering now")
    labels: list[str] | None = None
    problem_type: str | None = None
    variant: str | None = None
    precision: str | None = None
    batch_invariant: bool | None = Field(
        None, description="Whether a request's outputs are the same alone and in any batch (null: unknown)"
    )
    variant_note: str | None = None
    variant_reason: str | None = Field(
        None,
        description="Why this variant: CPU_VARIANT, or the one exact at full speed on this CPU's INT8 kernel",
    )
    device: str | None = None
    execution_provider: str | None = None
    providers: list[str] = Field(default_factory=list)
    intra_op_threads: int | None = None
    instances: int | None = None
    solo_threads: int | None = Field(
        None, description="Threads of the session that runs a batch alone in the idle model (null: none)"
    )
    max_seq_len: int | None = None
    qa_defaults: dict[str, int] | None = None
    pooling: dict[str, str | bool | int] | None = Field(
        None, description="Sentence encoders: mode (mean, cls, max), normalize (the model's own), dimensions"
    )
    limits: dict[str, int | float | str] = Field(default_factory=dict)
    load_seconds: float | None = None
    versions: list[VersionInfo] = Field(
        default_factory=list, description="Recent version events, newest first"
    )


class ModelsResponse(BaseModel):
    models: list[ModelInfo]
    memory_mb: float | None = Field(None, description="Sum over the serving versions")
    max_models_memory_mb: float | None = Field(None, description="MAX_MODELS_MEMORY_MB, if set")


class LoadResponse(BaseModel):
    changed: bool = Field(description="A new version went into service (false: these files already serve)")
    model: ModelInfo


class UnloadResponse(BaseModel):
    waited_s: float = Field(description="How long the in-flight requests took to finish")
    model: ModelInfo


class PollResponse(BaseModel):
    loaded: list[str]
    rejected: list[str]
    unloaded: list[str]


# ----------------------------------------------------------------------------- tokenize


class TokenizeRequest(Strict):
    """TEI's /tokenize request, with the `model` field of every route here."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={"examples": [{"inputs": "Angela Merkel met Emmanuel Macron."}]},
    )
    inputs: Text | Annotated[list[Text], Field(min_length=1)] = Field(
        description="One text, or a list (answered as a list per text)"
    )
    add_special_tokens: StrictBool = Field(True, description="Show the [CLS] and [SEP] the model reads")
    model: ModelName | None = Field(
        None, description="Whose tokenizer (a name from /models); default: any, when all models share one"
    )

    @property
    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else self.inputs


class TokenOut(BaseModel):
    id: int
    text: str = Field(description="input[start:stop]; for a special token the tokenizer added, its name")
    special: bool = Field(description="Added by the tokenizer ([CLS], [SEP]), not read from the text")
    start: int | None = Field(description="Character offset, inclusive; null for a special token")
    stop: int | None = Field(description="Character offset, exclusive; null for a special token")


# ----------------------------------------------------------------------------- decode, info


def _check_ids(value: list[Any]) -> list[Any]:
    nested = bool(value) and isinstance(value[0], list)
    for n, ids in enumerate(value if nested else [value]):
        if not isinstance(ids, list) or not ids:
            raise ValueError(f"ids.{n} must be a non-empty list of token ids")
        for k, token in enumerate(ids):
            if type(token) is not int or token < 0:  # not bool, not float
                where = f"ids.{n}.{k}" if nested else f"ids.{k}"
                raise ValueError(f"{where} is {token!r}: a token id is an integer from 0")
    return value


_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
TokenIds = Annotated[
    list[Any],
    Field(min_length=1),
    AfterValidator(_check_ids),
    WithJsonSchema({"anyOf": [_IDS_SCHEMA, {"type": "array", "items": _IDS_SCHEMA, "minItems": 1}]}),
]


class DecodeRequest(Strict):
    """TEI's /decode, with the `model` field of /tokenize."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [{"ids": [7, 8, 9]}, {"ids": [[7, 8], [9]], "skip_special_tokens": False}]
        },
    )
    ids: TokenIds = Field(description="One sequence of token ids, or a list of them")
    skip_special_tokens: StrictBool = Field(True, description="Leave out [CLS], [SEP], [PAD] and the like")
    model: ModelName | None = Field(
        None, description="Whose tokenizer (a name from /models); default: any, when all models share one"
    )

    @property
    def sequences(self) -> list[list[int]]:
        return self.ids if isinstance(self.ids[0], list) else [self.ids]


class DecodeResponse(RootModel[list[str]]):
    """One text per sequence of ids, in order (TEI's bare list)."""


class TEIInfo(BaseModel):
    """TEI's /info for one model; `model_type` has TEI's three kinds (embedding, classifier,
    reranker), and this service's task name for the others."""

    model_id: str = Field(description="The model's name here")
    model_sha: str | None = Field(description="The serving version")
    model_dtype: str = Field(description="The served variant's precision: float32, float16 or int8")
    model_type: dict[str, dict[str, Any]] = Field(
        description='{"embedding": {"pooling": "mean"}}, {"classifier": {"id2label": ..., "label2id": ...}}, '
        '{"reranker": ...}, or {task: {...}}'
    )
    max_concurrent_requests: int = Field(description="MAX_IN_FLIGHT")
    max_input_length: int = Field(description="Tokens the model reads at most, [CLS] and [SEP] included")
    max_batch_tokens: int | None = Field(description="Padded tokens a batch holds at most")
    max_batch_requests: int = Field(description="MAX_BATCH_SIZE: work items a batch holds at most")
    max_client_batch_size: int = Field(description="MAX_BATCH_ITEMS: inputs one request may send")
    auto_truncate: bool = Field(
        description="Long inputs are cut (or windowed) unless a request says otherwise"
    )
    tokenization_workers: int = Field(description="Front-end processes, each tokenizing (API_SERVERS)")
    version: str
    sha: str | None = None
    docker_label: str | None = None
