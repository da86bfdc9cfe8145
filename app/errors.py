"""Every failure the service reports, in one hierarchy, typed and free of HTTP.

Services, the batcher, the registry, routes and middleware raise these (or, in ASGI middleware,
build them); app/api/error_table.py maps each class to its status, error code and headers in one table.
The message is written for the client; `field` names the offending field, if any.
"""

from __future__ import annotations

from pathlib import Path


class ServiceError(Exception):
    field: str | None = None  # the field a subclass's errors are about unless one is given

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field if field is not None else type(self).field


# ----------------------------------------------------------------------------- requests


class RequestError(ServiceError):
    """Something wrong with the request itself."""


class TextTooLong(RequestError):
    """A text, question, context or choice beyond MAX_TEXT_CHARS / MAX_QA_CONTEXT_CHARS."""


class InputTooLong(RequestError):
    """An input of more tokens than the model reads, when the request asked not to truncate it."""


class TooManyInputs(RequestError):
    """A batch /classify or embedding request with more texts than MAX_BATCH_ITEMS."""


class TooManyChoices(RequestError):
    """A /multiple-choice request with more choices than MAX_CHOICES."""


class InvalidInput(RequestError):
    """A value the schema accepts but this model cannot use (top_k beyond its labels, a doc_stride
    that does not fit the question's window)."""


class InvalidTensor(RequestError):
    """A V2 inference request whose tensors do not fit the model's: an unknown or missing input, a
    wrong datatype, a shape that does not match the data or the model, an unknown parameter."""


class BodyTooLarge(RequestError):
    """A request body beyond MAX_BODY_BYTES."""


class Unauthorized(RequestError):
    """A missing or wrong bearer key."""


class Overloaded(RequestError):
    """Too many requests of the task in flight (MAX_IN_FLIGHT): refused before parsing; retry."""


class RequestTimeout(RequestError):
    """The request line and headers (HEADER_TIMEOUT_S) or the body (BODY_TIMEOUT_S) came too slowly."""


class HeadersTooLarge(RequestError):
    """The request line and headers exceed MAX_HEADER_BYTES."""


class UnsupportedMediaType(RequestError):
    """A body in an encoding the service does not decode (Content-Encoding: gzip, ...)."""


class ServerBusy(RequestError):
    """Too many connections (MAX_CONNECTIONS), bodies still arriving (MAX_PENDING_BODY_MB), or queued
    work the server could not start within MAX_QUEUE_MS: retry later."""


class InternalError(RequestError):
    """An unhandled failure; the client learns nothing of it but the request id."""


# ----------------------------------------------------------------------------- models


class ModelError(ServiceError):
    """Finding, loading and serving models by name; the message names what to do."""


class NoModel(ModelError):
    """No model of that name is served, or none serves the task; the message lists those that are."""

    field = "model"

    @classmethod
    def not_serving(cls, model: str, version: str, serving: str | None) -> NoModel:
        """A request for a version of `model` other than the one in service (`serving`)."""
        return cls(f"model {model!r} does not serve version {version!r} (serving: {serving or 'none'})")


class NotAReranker(ModelError):
    """/rerank named a classify model whose outputs are no relevance score (more than two labels)."""

    field = "model"


class ModelRequired(ModelError):
    """Several models serve the task and none is its default: the request must name one."""

    field = "model"


class InvalidModelName(ModelError):
    """A name that cannot be a model directory (path separators, dots, odd characters)."""

    field = "model"


class ModelLoading(ModelError):
    """The model has no version in service yet; retry shortly."""


class ModelUnavailable(ModelError):
    """The model failed to load, or is being unloaded."""


class VersionRejected(ModelError):
    """A version failed verification (hashes, sessions, warm-up, output check) and was not put in
    service; the version already serving, if any, keeps serving."""

    def __init__(self, message: str, serving: str | None):
        super().__init__(message)
        self.serving = serving


class MemoryLimitExceeded(VersionRejected):
    """Loading the version would take the models' resident memory above MAX_MODELS_MEMORY_MB."""


class AdminDisabled(ModelError):
    """The admin API is off because ADMIN_API_KEY is unset."""


def hide_paths(text: str | None, models_dir: Path) -> str | None:
    """`text` as a client may read it: MODELS_DIR's absolute path (what a load error names) replaced
    by `MODELS_DIR`, so answers never show where the server keeps its files; the logs keep it."""
    if not text:
        return text
    roots = {str(models_dir.resolve()), str(models_dir.absolute()), str(models_dir)}
    for root in sorted(roots, key=len, reverse=True):
        if root not in (".", ""):
            text = text.replace(root, "MODELS_DIR")
    return text
