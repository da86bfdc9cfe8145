"""Issue 42, cheap refusals: a large body's lists are counted from its bytes before pydantic builds
anything (app/api/precount.py), so an oversized batch costs milliseconds, not a parse."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from app.api.native_schemas import ClassifyRequest
from app.api.precount import PRECOUNT_BYTES, precount
from app.api.v2_schemas import V2InferRequest
from tests.app.conftest import serving
from tests.helpers.v2 import bytes_request, zero_length_elements


def body(value: object) -> bytes:
    return json.dumps(value).encode()


def test_oversized_lists_of_texts_objects_or_lists_are_refused_by_name():
    many = [{"text": "x"}] * 65
    error = precount("/classify", body({"inputs": many}), 64, 16)
    assert error is not None and error.field == "inputs" and "65 items" in str(error)
    assert precount("/classify", body({"inputs": many[:64]}), 64, 16) is None
    assert precount("/embed", body({"inputs": ["a"] * 100}), 64, 16).field == "inputs"
    assert precount("/v1/embeddings", body({"input": [[1, 2]] * 100}), 64, 16).field == "input"


def test_what_is_not_a_count_problem_is_left_to_the_route():
    # A list of numbers is one tokenized input (OpenAI's token ids), not a batch.
    assert precount("/v1/embeddings", body({"input": list(range(5000))}), 64, 16) is None
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for raw in (b"{not json", b"[1, 2]", b'"text"', body({"inputs": "a string"}), deep):
        assert precount("/classify", raw, 64, 16) is None
    # Nested lists (a question's choices) are the route's: MAX_CHOICES is its own limit.
    assert precount("/multiple-choice", body({"question": "q", "choices": ["a"] * 50}), 64, 16) is None


def test_v2_shapes_are_checked_without_decoding_data():
    tensor = {"name": "text", "shape": [200_000], "datatype": "BYTES", "data": ["x"] * 200_000}
    error = precount("/v2/models/m/infer", body({"inputs": [tensor]}), 64, 16)
    assert error is not None and "200000 rows" in str(error)
    empty = {"name": "text", "shape": [2, 0], "datatype": "BYTES", "data": []}
    assert "every axis" in str(precount("/v2/models/m/infer", body({"inputs": [empty]}), 64, 16))
    assert precount("/v2/models/m/infer", body({"inputs": [{**tensor, "shape": "bad"}]}), 64, 16) is None
    assert precount("/v2/models/m", body({"inputs": [tensor]}), 64, 16) is None  # not an inference


@pytest.mark.asyncio
async def test_the_service_refuses_a_huge_batch_before_pydantic_parses_it(models_dir, monkeypatch):
    parsed: list[int] = []
    for schema in (ClassifyRequest, V2InferRequest):
        real = schema.model_validate_json

        def spy(raw, *args, real=real, **kwargs):
            parsed.append(len(raw))
            return real(raw, *args, **kwargs)

        monkeypatch.setattr(schema, "model_validate_json", spy)
    huge = body({"inputs": [{"text": "x"}] * 56_000})
    assert len(huge) > PRECOUNT_BYTES
    rows = {"name": "text", "shape": [20_000], "datatype": "BYTES", "data": ["x"] * 20_000}
    async with serving(models_dir) as (_, client):
        headers = {"content-type": "application/json"}
        refused = await client.post("/classify", content=huge, headers=headers)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"] == "too_many_inputs" and "56000 items" in refused.text
        v2_body = body({"inputs": [rows]})
        v2 = await client.post("/v2/models/sst2-tiny/infer", content=v2_body, headers=headers)
        assert v2.status_code == 400 and "20000 rows" in v2.json()["error"]  # V2's error body
        assert not parsed, "pydantic parsed a body the counts refuse"
        fine = await client.post("/classify", json={"inputs": [{"text": "x" * 600}] * 60})
        assert fine.status_code == 200 and parsed, fine.text  # a large body within the limits is served


@pytest.mark.asyncio
async def test_a_refusal_by_counts_waits_the_delay_and_others_go_on(models_dir):
    """REFUSAL_DELAY_MS: the 422 comes after the delay, and a small request sent meanwhile is
    answered first (the delay is a sleep, not a hold on the loop)."""
    huge = body({"inputs": [{"text": "x"}] * 56_000})
    async with serving(models_dir, refusal_delay_ms=400) as (_, client):
        started = time.perf_counter()
        refusal = asyncio.create_task(
            client.post("/classify", content=huge, headers={"content-type": "application/json"})
        )
        await asyncio.sleep(0.05)  # the refusal is counted and waiting
        fine = await client.post("/classify", json={"text": "fine"})
        assert fine.status_code == 200 and not refusal.done()
        refused = await refusal
        assert refused.status_code == 422 and time.perf_counter() - started >= 0.4


@pytest.mark.asyncio
async def test_a_v2_binary_request_is_refused_from_its_json_header_before_its_data_is_read(models_dir):
    whole, header_length = bytes_request([200_000], zero_length_elements(200_000))
    header, raw = whole[:header_length], whole[header_length:]
    sent: list[int] = []

    async def chunks():
        for start in range(0, len(header + raw), 65536):
            sent.append(start)
            yield (header + raw)[start : start + 65536]

    async with serving(models_dir) as (_, client):
        refused = await client.post(
            "/v2/models/sst2-tiny/infer",
            content=chunks(),
            headers={
                "inference-header-content-length": str(len(header)),
                "content-type": "application/octet-stream",
            },  # fmt: skip
        )
    assert refused.status_code == 400 and "200000 rows" in refused.json()["error"], refused.text
    assert refused.headers["connection"] == "close"  # the rest of the body is left unread
    assert len(sent) < len(header + raw) // 65536


@pytest.mark.asyncio
@pytest.mark.parametrize("declared", [b"\xb2", b"9" * 5000, b"-1"])
async def test_a_v2_header_length_that_is_no_plain_number_gets_a_400(models_dir, declared):
    """ "²" (latin-1 0xb2) passes str.isdigit() and fails int(): the route words it, never a 500."""
    async with serving(models_dir) as (_, client):
        r = await client.post(
            "/v2/models/sst2-tiny/infer",
            content=body({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}),
            headers={"content-type": "application/json", "inference-header-content-length": declared},
        )
    assert r.status_code == 400 and "byte count" in r.json()["error"], r.text
