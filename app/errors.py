"""One JSON error shape for every failure: {"error", "message", "fields", "request_id"}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .batcher import BatcherClosed, BatchFailed, QueueFull, TooLarge
from .logs import request_id_var
from .model_errors import (
    AdminDisabled,
    InvalidModelName,
    MemoryLimitExceeded,
    ModelError,
    ModelLoading,
    ModelRequired,
    ModelUnavailable,
    NoModel,
    VersionRejected,
)

log = logging.getLogger("app.errors")

RETRY_AFTER_S = 1

# Model selection and control (app/model_errors.py): status, error code, and whether a retry may help.
MODEL_ERRORS: dict[type[ModelError], tuple[int, str, bool]] = {
    NoModel: (404, "no_model", False),
    AdminDisabled: (404, "admin_disabled", False),
    InvalidModelName: (422, "invalid_request", False),
    ModelRequired: (422, "model_required", False),
    VersionRejected: (422, "version_rejected", False),
    MemoryLimitExceeded: (409, "memory_limit", False),
    ModelLoading: (503, "model_loading", True),
    ModelUnavailable: (503, "model_unavailable", True),
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}


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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        fields = [{"field": exc.field, "message": exc.message}] if exc.field else None
        return error_response(exc.status, exc.code, exc.message, fields, exc.headers)

    @app.exception_handler(ModelError)
    async def _model_error(request: Request, exc: ModelError) -> JSONResponse:
        # The most specific class listed wins (MemoryLimitExceeded is a VersionRejected).
        kind = next(k for k in type(exc).__mro__ if k in MODEL_ERRORS)
        status, code, retry = MODEL_ERRORS[kind]
        field = "model" if isinstance(exc, (NoModel, ModelRequired, InvalidModelName)) else None
        fields = [{"field": field, "message": exc.message}] if field else None
        headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else None
        return error_response(status, code, exc.message, fields, headers)

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

    @app.exception_handler(QueueFull)
    async def _queue_full(request: Request, exc: QueueFull) -> JSONResponse:
        return error_response(
            429,
            "overloaded",
            f"server is busy: {exc}; retry after {RETRY_AFTER_S}s",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    @app.exception_handler(TooLarge)
    async def _too_large(request: Request, exc: TooLarge) -> JSONResponse:
        return error_response(413, "too_large", f"{exc}: shorten the input or raise MAX_QUEUE")

    @app.exception_handler(BatchFailed)
    async def _batch_failed(request: Request, exc: BatchFailed) -> JSONResponse:
        # The batcher has logged the model's error with its traceback; the client gets no internals.
        message = f"inference failed for the batch holding this request (batch {exc.batch_id}); retry later"
        return error_response(500, "inference_failed", message)

    @app.exception_handler(BatcherClosed)
    async def _closed(request: Request, exc: BatcherClosed) -> JSONResponse:
        return error_response(503, "shutting_down", str(exc), headers={"Retry-After": str(RETRY_AFTER_S)})
