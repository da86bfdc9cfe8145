"""Malformed requests: always a 4xx JSON error naming the field, never a 5xx or a traceback."""

from __future__ import annotations

from tests.app.conftest import serving

OK = {
    "/classify": {"text": "good"},
    "/ner": {"text": "john"},
    "/multiple-choice": {"context": "the cat", "choices": ["a", "b"]},
    "/qa": {"question": "who?", "context": "john smith"},
}

# (path, body, expected status, field the error must name)
BAD_BODIES = [
    ("/classify", {}, 422, "body"),
    ("/classify", {"text": 5}, 422, "text"),
    ("/classify", {"text": ""}, 422, "text"),
    ("/classify", {"text": " \t\n"}, 422, "text"),
    ("/classify", {"text": None}, 422, "body"),
    ("/classify", {"text": "a", "inputs": [{"text": "b"}]}, 422, "body"),
    ("/classify", {"inputs": []}, 422, "inputs"),
    ("/classify", {"inputs": "good"}, 422, "inputs"),
    ("/classify", {"inputs": [{"text": "a"}, {"text": ""}]}, 422, "inputs.1.text"),
    ("/classify", {"inputs": [{"text": "a"}], "text_pair": "b"}, 422, "body"),
    ("/classify", {"text": "a", "top_k": 0}, 422, "top_k"),
    ("/classify", {"text": "a", "top_k": 3}, 422, "top_k"),  # the bundle has 2 labels
    ("/classify", {"text": "a", "top_k": "two"}, 422, "top_k"),
    ("/classify", {"txt": "a"}, 422, "txt"),
    ("/ner", {"text": "a", "aggregation": "bogus"}, 422, "aggregation"),
    ("/ner", {"text": ["a"]}, 422, "text"),
    ("/ner", b'{"text": "\\ud800 lone surrogate"}', 422, "text"),  # valid JSON, invalid Unicode
    ("/multiple-choice", {"context": "c", "choices": ["only one"]}, 422, "choices"),
    ("/multiple-choice", {"context": "c", "choices": []}, 422, "choices"),
    ("/multiple-choice", {"context": "c", "choices": ["a", ""]}, 422, "choices.1"),
    ("/multiple-choice", {"context": "c", "choices": [f"c{i}" for i in range(17)]}, 422, "choices"),
    ("/multiple-choice", {"choices": ["a", "b"]}, 422, "context"),
    ("/multiple-choice", {"context": "c", "question": "", "choices": ["a", "b"]}, 422, "question"),
    ("/qa", {"question": "q", "context": "c", "top_k": 0}, 422, "top_k"),
    ("/qa", {"question": "q", "context": "c", "top_k": 21}, 422, "top_k"),
    ("/qa", {"question": "q", "context": "c", "doc_stride": -1}, 422, "doc_stride"),
    ("/qa", {"question": "q", "context": "c", "doc_stride": 200}, 422, "doc_stride"),  # > window
    ("/qa", {"question": "q", "context": "c", "max_answer_len": 0}, 422, "max_answer_len"),
    ("/qa", {"question": "", "context": "c"}, 422, "question"),
    ("/qa", {"question": "q"}, 422, "context"),
    (
        "/qa",
        {"question": "q", "context": "c", "handle_impossible_answer": "maybe"},
        422,
        "handle_impossible_answer",
    ),
]


def assert_error(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"] and body["message"] and "Traceback" not in response.text
    if field is not None:
        named = [f["field"] for f in body.get("fields", [])]
        assert field in named, (field, body)
    return body


async def test_bad_bodies(served):
    _, client = served
    for path, ok in OK.items():
        assert (await client.post(path, json=ok)).status_code == 200
    for path, body, status, field in BAD_BODIES:
        if isinstance(body, bytes):
            response = await client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            response = await client.post(path, json=body)
        assert_error(response, status, field)


async def test_undecodable_bodies(served):
    _, client = served
    json_header = {"content-type": "application/json"}
    for raw, status in [
        (b'{"text": ', 422),  # truncated JSON
        (b"{'text': 'single quotes'}", 422),
        (b'{"text": "caf\xe9"}', 400),  # latin-1, not UTF-8
        (b"[1, 2]", 422),
        (b"", 422),
        (b"null", 422),
    ]:
        body = assert_error(await client.post("/ner", content=raw, headers=json_header), status, "body")
        assert body["request_id"]
    # Not declared as JSON: still a 4xx that says what to send.
    plain = assert_error(await client.post("/ner", content=b'{"text": "x"}'), 422, "body")
    assert "application/json" in plain["message"]


async def test_size_limits(models_dir):
    limits = {
        "max_body_bytes": 4096,
        "max_text_chars": 1000,
        "max_qa_context_chars": 2000,
        "max_batch_items": 3,
    }
    async with serving(models_dir, **limits) as (_, client):
        huge = {"text": "a " * 5000}
        assert_error(await client.post("/ner", json=huge), 413, "body")

        async def chunks():  # no Content-Length: the limit must hold on the streamed bytes too
            for _ in range(10):
                yield b" " * 1000

        streamed = await client.post("/ner", content=chunks(), headers={"content-type": "application/json"})
        assert_error(streamed, 413, "body")

        assert_error(await client.post("/ner", json={"text": "a" * 1001}), 413, "text")
        assert_error(
            await client.post("/classify", json={"text": "a", "text_pair": "b" * 1001}), 413, "text_pair"
        )
        batch = {"inputs": [{"text": "a"}, {"text": "b" * 1001}]}
        assert_error(await client.post("/classify", json=batch), 413, "inputs.1.text")
        assert_error(await client.post("/classify", json={"inputs": [{"text": "a"}] * 4}), 422, "inputs")
        qa = {"question": "q", "context": "c" * 2001}
        assert_error(await client.post("/qa", json=qa), 413, "context")
        assert (await client.post("/qa", json={"question": "q", "context": "c " * 900})).status_code == 200
        mc = {"context": "c", "choices": ["a", "b" * 1001]}
        assert_error(await client.post("/multiple-choice", json=mc), 413, "choices.1")
        metrics = (await client.get("/metrics")).text
        assert 'bert_rejected_total{model="",reason="payload_too_large",task="ner"} 2.0' in metrics


async def test_unknown_routes_and_methods(models_dir):
    async with serving(models_dir) as (_, client):
        assert_error(await client.get("/nope"), 404)
        assert_error(await client.get("/classify"), 405)
        metrics = (await client.get("/metrics")).text
        assert 'endpoint="other",model="",status="404"' in metrics  # raw paths never become label values


async def test_task_without_bundle(make_models_dir):
    async with serving(make_models_dir(("classify",))) as (_, client):
        for path, body in OK.items():
            if path == "/classify":
                continue
            error = assert_error(await client.post(path, json=body), 404)
            assert error["error"] == "no_model" and "classify" in error["message"]
        assert (await client.post("/classify", json=OK["/classify"])).status_code == 200


async def test_cors_origins(served, models_dir):
    async with serving(models_dir, cors_origins="https://a.example, https://b.example") as (_, client):
        preflight = {
            "origin": "https://b.example",
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,authorization",
        }
        r = await client.options("/classify", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://b.example"
        r = await client.post("/classify", json=OK["/classify"], headers={"origin": "https://a.example"})
        assert r.headers["access-control-allow-origin"] == "https://a.example"
        assert "server-timing" in r.headers["access-control-expose-headers"].lower()
        r = await client.post("/classify", json=OK["/classify"], headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
    _, client = served  # none configured: no CORS headers at all
    r = await client.post("/classify", json=OK["/classify"], headers={"origin": "https://a.example"})
    assert "access-control-allow-origin" not in r.headers


async def test_request_ids(served):
    _, client = served
    r = await client.post("/classify", json=OK["/classify"], headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    bad = await client.post("/ner", json={"text": ""}, headers={"x-request-id": "no spaces <script>"})
    generated = bad.headers["x-request-id"]
    assert generated != "no spaces <script>" and len(generated) == 32
    assert bad.json()["request_id"] == generated
    a = (await client.get("/health")).headers["x-request-id"]
    b = (await client.get("/health")).headers["x-request-id"]
    assert a != b
