"""The plain ONNX Runtime peer: our response shapes, the bundle's own file, the same QA spans as the
transformers baseline on the same weights."""

from __future__ import annotations

import random

import httpx
import pytest

from benchmarks.loadgen_payloads import make_payload, validate_response
from benchmarks.pipeline_server import HFQuestionAnswering, qa_settings_from_bundle
from benchmarks.pipeline_server import create_ort_app as create_app


async def post(app, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://peer") as client:
        return await client.post(path, json=body)


@pytest.fixture(scope="module")
def app(tiny_bundles):
    return create_app(tiny_bundles["classify"], tiny_bundles["qa"], variant=None, threads=1)


async def test_endpoints_answer_with_our_response_shapes(app):
    assert app.state.info["variant"] == "int8-rowwise"  # the file our server picks on CPU
    rng = random.Random(2)
    for endpoint in ("classify", "qa"):
        for _ in range(3):
            payload = make_payload(endpoint, rng)
            response = await post(app, f"/{endpoint}", payload)
            assert response.status_code == 200, response.text
            assert validate_response(endpoint, payload, response.json()) is None
    batch = await post(
        app, "/classify", {"inputs": [{"text": "good movie"}, {"text": "bad", "text_pair": "film"}]}
    )
    assert len(batch.json()["results"]) == 2
    assert (await post(app, "/classify", {"text": "x", "inputs": [{"text": "y"}]})).status_code == 422


async def test_qa_spans_equal_the_transformers_baseline_on_the_fp32_file(tiny_checkpoints, tiny_bundles):
    peer = create_app(qa=tiny_bundles["qa"], variant="fp32", threads=1)
    baseline = HFQuestionAnswering(tiny_checkpoints["qa"], qa_settings_from_bundle(tiny_bundles["qa"]))
    rng = random.Random(3)
    for _ in range(4):
        payload = make_payload("qa", rng)
        got = (await post(peer, "/qa", payload)).json()
        options = {k: v for k, v in payload.items() if k not in ("question", "context")}
        expected, windows = baseline(payload["question"], payload["context"], **options)
        assert got["windows"] == windows
        assert [(a["start"], a["end"]) for a in got["answers"]] == [(a["start"], a["end"]) for a in expected]
        assert got["answers"][0]["score"] == pytest.approx(expected[0]["score"], abs=1e-4)
