"""What can go wrong finding, loading and serving models by name: typed, and free of HTTP.

The registry and the admin routes raise these; app/errors.py maps each class to its status
and error code in one table.
"""

from __future__ import annotations


class ModelError(Exception):
    """Base class: the message is written for the client and names what to do."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class NoModel(ModelError):
    """No model of that name is served, or none serves the task; the message lists those that are."""


class ModelRequired(ModelError):
    """Several models serve the task and none is its default: the request must name one."""


class InvalidModelName(ModelError):
    """A name that cannot be a model directory (path separators, dots, odd characters)."""


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
