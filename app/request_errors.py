"""What can be wrong with a request, typed and free of HTTP.

Services, routes and middleware raise (or, in ASGI middleware, build) these; app/errors.py maps
each class to its status, error code and headers in one table, as it does for app/model_errors.py.
"""

from __future__ import annotations


class RequestError(Exception):
    """Base class: the message is written for the client; `field` names the offending field."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message, self.field = message, field


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


class InternalError(RequestError):
    """An unhandled failure; the client learns nothing of it but the request id."""
