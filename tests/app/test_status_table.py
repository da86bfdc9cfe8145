"""HTTP statuses are decided in one module (app/api/error_table.py), from typed errors."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from app import errors as typed
from app.api import error_table as errors

TABLE = Path(errors.__file__).resolve()
APP = TABLE.parent.parent
STATUSES = {400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 429, 431, 499, 500, 502, 503, 504}


def test_no_other_app_module_writes_an_error_status() -> None:
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        if path == TABLE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in STATUSES:
                offenders.append(f"{path.name}:{node.lineno}: {node.value}")
    assert not offenders, offenders


def test_every_typed_error_has_its_status() -> None:
    abstract = {typed.ServiceError, typed.RequestError, typed.ModelError}
    for _, cls in inspect.getmembers(typed, inspect.isclass):
        if issubclass(cls, typed.ServiceError) and cls not in abstract:
            assert cls in errors.ERRORS, cls


def test_the_most_specific_class_wins() -> None:
    exceeded = typed.MemoryLimitExceeded("too big", serving=None)
    assert errors.status_of(exceeded).code == "memory_limit"
    assert errors.status_of(typed.VersionRejected("bad", serving=None)).code == "version_rejected"


def test_a_retryable_error_says_when_and_a_challenge_names_its_scheme() -> None:
    busy = errors.domain_error_response(typed.Overloaded("busy"), "busy")
    assert busy.status_code == 429 and busy.headers["Retry-After"] == str(errors.RETRY_AFTER_S)
    denied = errors.domain_error_response(typed.Unauthorized("no key"), "no key")
    assert denied.status_code == 401 and denied.headers["WWW-Authenticate"] == "Bearer"
    assert "retry-after" not in denied.headers


def test_every_status_has_its_grpc_code() -> None:
    import grpc

    statuses = {status.status for status in errors.ERRORS.values()} | {errors.CLIENT_CLOSED}
    assert statuses <= set(errors.GRPC_CODES)
    assert all(isinstance(grpc.StatusCode[name], grpc.StatusCode) for name in errors.GRPC_CODES.values())
