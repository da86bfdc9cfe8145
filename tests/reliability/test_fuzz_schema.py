"""Schemathesis over the service's own OpenAPI schema, against a live uvicorn process.

Every operation gets schema-valid requests and, where it has a body, schema-violating ones.
schemathesis' own checks judge each response: no 5xx, a documented status code, the documented
content type and headers, a body that conforms to the response schema, and invalid data refused.
Its pytest plugin does not run under pytest 9, so hypothesis drives `operation.as_strategy()` and
each case goes through `case.call_and_validate`. Examples are bounded and derandomized (the same
cases every run), 20 per operation and mode in the suite; raise
FUZZ_EXAMPLES for a longer hunt.

Valid requests must be served. The only refusals allowed are the deployment's limits, which the
schema cannot state: character and item limits (MAX_TEXT_CHARS, MAX_CHOICES, ...), `top_k` above
the bundle's label count, a `doc_stride` too large for the question's window, and a `model` name
that is well formed but not one of the models loaded (404 no_model).
"""

from __future__ import annotations

import os
from collections import Counter

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.reliability.conftest import AUTH

MAX_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))


def not_a_server_error_but_a_deadline(ctx, response, case):
    """A 504 for a timeout_ms shorter than the work is the client's own deadline, not a server error."""
    if response.status_code == 504 and "deadline exceeded" in response.text:
        return None
    return not_a_server_error(ctx, response, case)


CHECKS = [
    not_a_server_error_but_a_deadline,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
TASK_PATHS = {"/classify", "/ner", "/multiple-choice", "/qa"}
# Refusals of schema-valid data that depend on the deployment, not on the schema.
LIMIT_ERRORS = {"text_too_long", "too_large", "payload_too_large", "too_many_inputs", "too_many_choices"}
LIMIT_ERRORS |= {"deadline_exceeded"}  # a timeout_ms shorter than the work: the client asked for it
DYNAMIC_FIELDS = {"/classify": {"top_k"}, "/qa": {"doc_stride"}}


def refusal_problem(path: str, status: int, body: dict) -> str | None:
    """Why a refusal of schema-valid data is wrong, or None when it is one of the allowed limits."""
    if status == 429 or body.get("error") in LIMIT_ERRORS:
        return None
    named = {f["field"] for f in body.get("fields", [])}
    if status == 404 and body.get("error") == "no_model" and named == {"model"}:
        return None  # the models loaded are the deployment's, not the schema's
    if status == 422 and named and named <= DYNAMIC_FIELDS.get(path, set()):
        return None
    return f"schema-valid request refused with {status}: {body}"


def test_schemathesis_finds_no_server_error_and_no_schema_violation(live):
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= TASK_PATHS | {"/health", "/ready", "/models", "/metrics"}
    outcomes: Counter[tuple[str, str, int]] = Counter()
    for operation in operations:
        modes = [GenerationMode.POSITIVE]
        if len(list(operation.body)):  # only a body has an invalid form to generate
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            fuzz_operation(operation, mode, outcomes)

    for path in TASK_PATHS:  # valid requests reached the model, invalid ones were refused
        # A valid request names no model or one the server lacks about as often as one it has.
        served, unknown_model = outcomes[(path, "positive", 200)], outcomes[(path, "positive", 404)]
        assert served >= MAX_EXAMPLES // 4 and served + unknown_model >= MAX_EXAMPLES // 2, (path, outcomes)
        refused = sum(n for (p, mode, status), n in outcomes.items() if p == path and mode == "negative")
        assert refused >= MAX_EXAMPLES // 2 and outcomes[(path, "negative", 200)] == 0, (path, outcomes)
    # A 504 is a request's own deadline (the check above made sure of its body), not a server error.
    assert not [key for key in outcomes if key[2] >= 500 and key[2] != 504], outcomes


def fuzz_operation(operation, mode: GenerationMode, outcomes: Counter[tuple[str, str, int]]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        # Raises schemathesis' FailureGroup, with a curl command to reproduce, on any failed check.
        response = case.call_and_validate(headers=AUTH, checks=CHECKS)
        outcomes[(operation.path, mode.value, response.status_code)] += 1
        if mode is GenerationMode.POSITIVE and operation.path in TASK_PATHS and response.status_code >= 400:
            problem = refusal_problem(operation.path, response.status_code, response.json())
            assert problem is None, f"{problem}\nrequest body: {case.body!r}"

    run()


def test_refusal_rules_accept_only_deployment_limits():
    """The allow-list above must not excuse a real rejection of valid data."""
    too_long = {"error": "text_too_long", "fields": [{"field": "text"}]}
    assert refusal_problem("/ner", 413, too_long) is None
    top_k = {"error": "invalid_request", "fields": [{"field": "top_k"}]}
    assert refusal_problem("/classify", 422, top_k) is None
    assert refusal_problem("/ner", 422, {"error": "invalid_request", "fields": [{"field": "text"}]})
    assert refusal_problem("/qa", 422, top_k)  # QA's top_k has a schema maximum: no excuse there
    assert refusal_problem("/classify", 422, {"error": "invalid_request", "fields": [{"field": "body"}]})
    assert refusal_problem("/qa", 400, {"error": "invalid_body"})
    unknown_model = {"error": "no_model", "fields": [{"field": "model"}]}
    assert refusal_problem("/ner", 404, unknown_model) is None
    assert refusal_problem("/ner", 404, {"error": "no_model"})  # no model for the task at all: a failure
