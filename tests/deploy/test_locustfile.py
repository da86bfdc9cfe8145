"""The locustfile, read with ast (locust is not installed in CI)."""

from __future__ import annotations

import ast

from benchmarks import loadgen_payloads
from tests.deploy.files import DEPLOY

LOCUSTFILE = DEPLOY / "loadtest" / "locustfile.py"


def parsed() -> ast.Module:
    return ast.parse(LOCUSTFILE.read_text(encoding="utf-8"))


def task_calls(tree: ast.Module) -> dict[str, int]:
    """endpoint -> weight, from `@task(weight)` methods whose body calls self.call("<endpoint>")."""
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        weights = [
            d.args[0].value
            for d in node.decorator_list
            if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "task" and d.args
        ]
        calls = [
            c.args[0].value
            for c in ast.walk(node)
            if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Attribute)
            and c.func.attr == "call"
            and c.args
        ]
        if weights and calls:
            found[calls[0]] = weights[0]
    return found


def test_every_endpoint_has_a_weighted_task():
    tasks = task_calls(parsed())
    assert set(tasks) == set(loadgen_payloads.ENDPOINTS)
    assert all(isinstance(w, int) and w > 0 for w in tasks.values())


def test_uses_the_shared_payloads_and_schema_checks():
    tree = parsed()
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks.loadgen_payloads"
        for alias in node.names
    }
    assert {"make_payload", "validate_response", "ENDPOINTS"} <= imported
    assert all(hasattr(loadgen_payloads, name) for name in imported)
    source = LOCUSTFILE.read_text()
    assert "catch_response=True" in source and "response.failure(" in source


def test_user_class_is_an_http_user():
    classes = [n for n in ast.walk(parsed()) if isinstance(n, ast.ClassDef)]
    bases = {b.id for c in classes for b in c.bases if isinstance(b, ast.Name)}
    assert bases & {"HttpUser", "FastHttpUser"}
