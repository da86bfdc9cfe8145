"""One JSON error shape per route family: {"error", "message", "fields", "request_id"}, and under
/v2 the Open Inference Protocol's {"error": message}.

The one module that decides HTTP statuses: services, the registry, routes and middleware raise
typed errors (app/errors.py, the batcher's), and ERRORS maps them.
"""

from __future__ import annotations

import functools
import json
import logging
from contextvars import ContextVar
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.service_schemas import ErrorResponse
from app.api.v2_schemas import V2ErrorResponse
from app.engine.batch_types import (
    BatcherClosed,
    BatchFailed,
    DeadlineExceeded,
    QueueFull,
    QueueTimedOut,
    TooLarge,
)
from app.errors import (
    AdminDisabled,
    BodyTooLarge,
    HeadersTooLarge,
    InputTooLong,
    InternalError,
    InvalidInput,
    InvalidModelName,
    InvalidTensor,
    MemoryLimitExceeded,
    ModelLoading,
    ModelRequired,
    ModelUnavailable,
    NoModel,
    NotAReranker,
    Overloaded,
    RequestTimeout,
    ServerBusy,
    ServiceError,
    TextTooLong,
    TooManyChoices,
    TooManyInputs,
    Unauthorized,
    UnsupportedMediaType,
    VersionRejected,
    hide_paths,
)
from app.observe.logs import request_id_var

log = logging.getLogger("app.errors")

RETRY_AFTER_S = 1
CLIENT_CLOSED = 499  # nginx's code for "client closed the request"; only ever seen in logs and metrics
NOT_READY = 503  # /ready while a model loads or the server shuts down

# The Open Inference Protocol's routes answer {"error": message}, and 400 where the native routes
# answer 422 (KServe's and Triton's status for any malformed request). The middleware sets this
# per request from the path, so a failure raised anywhere gets its family's body.
V2_PREFIX = "/v2"
V2_STATUS = {422: 400}
v2_errors: ContextVar[bool] = ContextVar("v2_errors", default=False)


def is_v2_path(path: str) -> bool:
    return path == V2_PREFIX or path.startswith(V2_PREFIX + "/")


@dataclass(frozen=True)
class Status:
    status: int
    code: str
    retry: bool = False  # a Retry-After header: trying again later may succeed
    headers: tuple[tuple[str, str], ...] = ()


# THE place where a failure gets its HTTP status: every typed error of the service, by class.
# The most specific class listed wins (MemoryLimitExceeded is a VersionRejected).
ERRORS: dict[type[Exception], Status] = {
    # requests (app/errors.py)
    TextTooLong: Status(413, "text_too_long"),
    InputTooLong: Status(413, "input_too_long"),
    BodyTooLarge: Status(413, "payload_too_large"),
    TooManyInputs: Status(422, "too_many_inputs"),
    TooManyChoices: Status(422, "too_many_choices"),
    InvalidInput: Status(422, "invalid_request"),
    InvalidTensor: Status(400, "invalid_tensor"),
    Unauthorized: Status(401, "unauthorized", headers=(("WWW-Authenticate", "Bearer"),)),
    Overloaded: Status(429, "overloaded", retry=True),
    RequestTimeout: Status(408, "request_timeout"),
    HeadersTooLarge: Status(431, "headers_too_large"),
    UnsupportedMediaType: Status(415, "unsupported_media_type"),
    ServerBusy: Status(503, "server_busy", retry=True),
    InternalError: Status(500, "internal_error"),
    # model selection and control (app/errors.py)
    NoModel: Status(404, "no_model"),
    AdminDisabled: Status(404, "admin_disabled"),
    InvalidModelName: Status(422, "invalid_request"),
    ModelRequired: Status(422, "model_required"),
    NotAReranker: Status(422, "not_a_reranker"),
    VersionRejected: Status(422, "version_rejected"),
    MemoryLimitExceeded: Status(409, "memory_limit"),
    ModelLoading: Status(503, "model_loading", retry=True),
    ModelUnavailable: Status(503, "model_unavailable", retry=True),
    # the batcher (app/engine/batcher.py)
    QueueFull: Status(429, "overloaded", retry=True),
    TooLarge: Status(413, "too_large"),
    BatchFailed: Status(500, "inference_failed"),
    BatcherClosed: Status(503, "shutting_down", retry=True),
    DeadlineExceeded: Status(504, "deadline_exceeded"),
    QueueTimedOut: Status(503, "queue_timeout", retry=True),
}

# The same statuses as gRPC codes (grpc.StatusCode names), for V2 over gRPC (app/api/grpc_v2/server.py).
GRPC_CODES = {
    **dict.fromkeys((400, 413, 415, 422, 431), "INVALID_ARGUMENT"),
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    CLIENT_CLOSED: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

# What the OpenAPI page lists for the task routes and the admin routes.
TASK_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "Body is not UTF-8 JSON",
        401: "Missing or wrong API key",
        404: "No model of that name, or none serves this task (`no_model`)",
        413: "Body or text too large",
        422: "Invalid request (the `fields` list names each problem); `model_required` when several "
        "models serve the task and none is its default",
        429: "Queue full; retry after Retry-After seconds",
        503: "Model loading, failed, or shutting down",
        504: "The request's timeout_ms passed before its work was computed (`deadline_exceeded`)",
    }.items()
}
V2_RESPONSES: dict[int | str, dict[str, Any]] = {
    V2_STATUS.get(int(code), int(code)): {"model": V2ErrorResponse, "description": response["description"]}
    for code, response in TASK_RESPONSES.items()
}
MODELS_RESPONSES: dict[int | str, dict[str, Any]] = {401: TASK_RESPONSES[401]}
# /tokenize runs no model: no queue (429) and no deadline (504).
TOKENIZE_RESPONSES = {code: TASK_RESPONSES[code] for code in (400, 401, 404, 413, 422, 503)}
# TEI's /info: a model by name, no body.
INFO_RESPONSES = {code: TASK_RESPONSES[code] for code in (401, 404, 503)}
ADMIN_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{code: TASK_RESPONSES[code] for code in (401, 503)},
    404: {
        **TASK_RESPONSES[404],
        "description": "Admin API off (`admin_disabled`), or no such model (`no_model`)",
    },
    409: {
        **TASK_RESPONSES[422],
        "description": "The version would exceed MAX_MODELS_MEMORY_MB (`memory_limit`)",
    },
    422: {
        **TASK_RESPONSES[422],
        "description": "The version failed its checks (`version_rejected`); the one serving still serves",
    },
}


def status_of(exc: Exception) -> Status:
    return status_for(type(exc))


@functools.cache
def status_for(kind: type[Exception]) -> Status:
    return ERRORS[next(k for k in kind.__mro__ if k in ERRORS)]


def domain_error_response(exc: Exception, message: str, field: str | None = None) -> JSONResponse:
    """The JSON error for a typed error of the table, with the message the client reads."""
    status = status_of(exc)
    headers = dict(status.headers)
    if status.retry:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    fields = [{"field": field, "message": message}] if field else None
    return error_response(status.status, status.code, message, fields, headers or None)


def raw_error(exc: ServiceError, v2: bool = False) -> bytes:
    """A whole HTTP/1.1 error response, for the connection layer (app/api/connections.py), which
    answers before any ASGI request exists; the connection closes after it. `v2`: KServe's body."""
    return _raw_error(type(exc), exc.message, v2)


@functools.lru_cache(maxsize=64)  # a flood of refusals is mostly one answer, written again and again
def _raw_error(kind: type[ServiceError], message: str, v2: bool) -> bytes:
    status = status_for(kind)
    code = V2_STATUS.get(status.status, status.status) if v2 else status.status
    fields = {"error": message} if v2 else {"error": status.code, "message": message}
    body = json.dumps(fields).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    headers += [("connection", "close")]
    headers += list(status.headers) + ([("retry-after", str(RETRY_AFTER_S))] if status.retry else [])
    head = f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\n"
    return (head + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1") + body


def error_body(code: str, message: str, fields: list[dict[str, str]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": code, "message": message}
    if fields:
        body["fields"] = fields
    request_id = request_id_var.get()
    if request_id:
        body["request_id"] = request_id
    return body


def error_response(
    status: int,
    code: str,
    message: str,
    fields: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    if v2_errors.get():
        return JSONResponse({"error": message}, status_code=V2_STATUS.get(status, status), headers=headers)
    return JSONResponse(error_body(code, message, fields), status_code=status, headers=headers)


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def validation_fields(errors: list[dict[str, Any]]) -> list[dict[str, str]]:
    fields = []
    for err in errors:
        kind = err.get("type", "")
        if kind == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            fields.append({"field": "body", "message": f"invalid JSON: {detail}".rstrip(": "), "type": kind})
            continue
        message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        field = _field_name(err.get("loc", ()))
        if kind == "missing" and field == "body":
            message = "a JSON request body is required"
        elif kind in ("model_attributes_type", "dict_type") and field == "body":
            message = "the body must be a JSON object (sent with Content-Type: application/json)"
        fields.append({"field": field, "message": message, "type": kind})
    return fields


def _body_error(message: str) -> tuple[str, list[dict[str, str]]]:
    return message, [{"field": "body", "message": message}]


def client_message(exc: ServiceError) -> str:
    """What the client reads: the error's message, with what to do where the batcher's says not."""
    if isinstance(exc, QueueFull):
        return f"server is busy: {exc}; retry after {RETRY_AFTER_S}s"
    if isinstance(exc, TooLarge):
        return f"{exc}: shorten the input or raise MAX_QUEUE"
    if isinstance(exc, BatchFailed):
        # The batcher has logged the model's error with its traceback; the client gets no internals.
        return f"inference failed for the batch holding this request (batch {exc.batch_id}); retry later"
    return exc.message


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        message = hide_paths(client_message(exc), request.app.state.service_state.settings.models_dir)
        return domain_error_response(exc, message or "", exc.field)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = validation_fields(list(exc.errors()))
        summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields) or "invalid request"
        return error_response(422, "invalid_request", summary, fields)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and "parsing the body" in str(exc.detail):
            # FastAPI's "error parsing the body"; the cause says what was wrong with it.
            cause = exc.__cause__
            if isinstance(cause, RecursionError):
                return error_response(422, "invalid_request", *_body_error("invalid JSON: nested too deeply"))
            if isinstance(cause, ValueError) and not isinstance(cause, UnicodeDecodeError):
                # e.g. an integer with more digits than Python converts
                return error_response(422, "invalid_request", *_body_error(f"invalid JSON: {cause}"))
            message, fields = _body_error("request body could not be decoded: send UTF-8 encoded JSON")
            return error_response(400, "invalid_body", message, fields, getattr(exc, "headers", None))
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(
            exc.status_code, "error"
        )
        return error_response(exc.status_code, code, str(exc.detail), None, getattr(exc, "headers", None))
