"""HTTP statuses are decided in one module (app/errors.py), from typed errors."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from app import errors, model_errors, request_errors

APP = Path(errors.__file__).resolve().parent
STATUSES = {400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 499, 500, 502, 503, 504}


def test_no_other_app_module_writes_an_error_status() -> None:
    offenders = []
    for path in sorted(APP.glob("*.py")):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in STATUSES:
                offenders.append(f"{path.name}:{node.lineno}: {node.value}")
    assert not offenders, offenders


def test_every_typed_error_has_its_status() -> None:
    for module, base in (
        (request_errors, request_errors.RequestError),
        (model_errors, model_errors.ModelError),
    ):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, base) and cls is not base:
                assert cls in errors.ERRORS, cls


def test_the_most_specific_class_wins() -> None:
    exceeded = model_errors.MemoryLimitExceeded("too big", serving=None)
    assert errors.status_of(exceeded).code == "memory_limit"
    assert errors.status_of(model_errors.VersionRejected("bad", serving=None)).code == "version_rejected"


def test_a_retryable_error_says_when_and_a_challenge_names_its_scheme() -> None:
    busy = errors.domain_error_response(request_errors.Overloaded("busy"), "busy")
    assert busy.status_code == 429 and busy.headers["Retry-After"] == str(errors.RETRY_AFTER_S)
    denied = errors.domain_error_response(request_errors.Unauthorized("no key"), "no key")
    assert denied.status_code == 401 and denied.headers["WWW-Authenticate"] == "Bearer"
    assert "retry-after" not in denied.headers
