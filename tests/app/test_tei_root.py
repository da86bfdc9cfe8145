"""text-embeddings-inference's default route (POST /, /invocations), its /info and /decode, and the
Inference API's `parameters` object on TEI's routes: what huggingface_hub's InferenceClient calls."""

from __future__ import annotations

from .conftest import MAX_SEQ_LEN, serving, wait_ready

ROOT_CASES = [  # (body, the route it must answer as)
    ({"inputs": ["a great film", "boring"]}, "/embed"),
    ({"inputs": "a great film", "normalize": False}, "/embed"),
    ({"inputs": "a great film", "parameters": {"normalize": False}}, "/embed"),
    ({"inputs": "a great film", "model": "classify"}, "/predict"),
    ({"inputs": "a great film", "model": "sparse"}, "/embed_sparse"),
    (
        {"inputs": {"source_sentence": "a cat", "sentences": ["a dog", "the mat"]}, "parameters": {}},
        "/similarity",
    ),
    ({"query": "a film", "texts": ["a great film", "boring"], "model": "classify"}, "/rerank"),
    ({"text": "mary won the game", "model": "ner"}, "/ner"),  # a task TEI lacks: its own route
    ({"inputs": "a great film", "model": "nope"}, "/embed"),  # 404 no_model from either
    ({"inputs": "a", "model": 7}, "/embed"),  # 422 naming `model` from either
    ({"inputs": ""}, "/embed"),  # 422 naming `inputs` from either
    ([1, 2], "/embed"),  # not an object: the embedding route's 422
]


def answer(reply) -> tuple[int, object]:
    body = reply.json()
    if isinstance(body, dict):
        body.pop("request_id", None)  # each request's own
    return reply.status_code, body


async def test_the_root_answers_as_the_route_tei_would_pick(served):
    _, client = served
    for body, path in ROOT_CASES:
        direct = await client.post(path, json=body)
        for root in ("/", "/invocations"):
            reply = await client.post(root, json=body)
            assert answer(reply) == answer(direct), (root, body)
            assert reply.headers.get("x-model") == direct.headers.get("x-model"), (root, body)
    garbled = await client.post("/", content=b"{not json", headers={"content-type": "application/json"})
    assert garbled.status_code == 422 and garbled.json()["error"] == "invalid_request"
    for probe in ("/", "/ping"):
        assert (await client.get(probe)).json() == (await client.get("/health")).json()


def admitted_as(app, path: str) -> str | None:
    """The task whose MAX_IN_FLIGHT slots a POST to `path` takes (before its body is read)."""
    from app.api.middleware import inference_task

    return inference_task({"type": "http", "method": "POST", "app": app, "path": path})


async def test_the_root_without_an_embedding_model_serves_the_classify_default(models_dir, make_models_dir):
    async with serving(models_dir) as (app, _):
        assert admitted_as(app, "/") == admitted_as(app, "/invocations") == "embed"
    async with serving(make_models_dir(("classify", "ner"))) as (app, client):
        root = await client.post("/", json={"inputs": "a great film"})
        predict = await client.post("/predict", json={"inputs": "a great film"})
        info = (await client.get("/info")).json()
        assert admitted_as(app, "/") == "classify"
    assert root.status_code == 200 and root.json() == predict.json()
    assert info["model_id"] == "classify" and set(info["model_type"]) == {"classifier"}
    async with serving(make_models_dir(("ner",))) as (app, client):
        alone = await client.post("/", json={"inputs": "a great film"})
        assert admitted_as(app, "/") is None  # nothing to admit: the route answers 404
    assert alone.status_code == 404 and "'model' field" in alone.json()["message"]


async def test_each_model_has_a_root_of_its_own(served):
    app, client = served
    for name, body, path in [
        ("embed", {"inputs": ["a cat", "a dog"]}, "/embed"),
        ("embed", {"inputs": "a cat", "model": "embed", "parameters": {"normalize": False}}, "/embed"),
        ("classify", {"inputs": "a great film"}, "/predict"),
        ("classify", {"query": "a film", "texts": ["a great film", "boring"]}, "/rerank"),
        ("sparse", {"inputs": "a cat"}, "/embed_sparse"),
        ("ner", {"text": "mary won the game"}, "/ner"),
        ("ner", {"text": ""}, "/ner"),  # the route's own 422
    ]:
        reply = await client.post(f"/models/{name}", json=body)
        direct = await client.post(path, json={**body, "model": name})
        assert answer(reply) == answer(direct) and reply.headers.get("x-model") == direct.headers.get(
            "x-model"
        )
    other = await client.post("/models/embed", json={"inputs": "a", "model": "classify"})
    unknown = await client.post("/models/nope", json={"inputs": "a"})
    assert other.status_code == 422 and "the path names 'embed'" in other.json()["message"]
    assert unknown.status_code == 404 and unknown.json()["error"] == "no_model"
    named, queried = await client.get("/models/classify/info"), await client.get("/info?model=classify")
    assert named.status_code == 200 and named.json() == queried.json()
    assert [(await client.get(f"/models/{n}/health")).status_code for n in ("ner", "nope")] == [200, 404]
    assert admitted_as(app, "/models/qa") == "qa" and admitted_as(app, "/models/nope") is None
    assert admitted_as(app, "/models/qa/info") is None  # not inference


async def test_the_root_names_a_broken_model_s_state(make_models_dir):
    models = make_models_dir(("embed", "classify"))
    (models / "classify" / "bundle.json").write_text("{not json", encoding="utf-8")  # no task known
    async with serving(models, ready=False) as (_, client):
        await wait_ready(client)
        broken = await client.post("/", json={"inputs": "a", "model": "classify"})
        info = await client.get("/info", params={"model": "classify"})
        fine = await client.post("/", json={"inputs": "a"})
        own = await client.post("/models/classify", json={"inputs": "a"})
        health = await client.get("/models/classify/health")
    assert broken.status_code == 503 and broken.json()["error"] == "model_unavailable"
    assert info.status_code == own.status_code == health.status_code == 503 and fine.status_code == 200


async def test_inference_parameters_are_the_route_s_own_fields(served):
    _, client = served
    lifted = await client.post("/predict", json={"inputs": "a film", "parameters": {"raw_scores": True}})
    direct = await client.post("/predict", json={"inputs": "a film", "raw_scores": True})
    assert lifted.status_code == 200 and lifted.json() == direct.json()
    full = (await client.post("/predict", json={"inputs": [["a film"], ["boring"]]})).json()
    best = await client.post(
        "/predict", json={"inputs": [["a film"], ["boring"]], "parameters": {"top_k": 1}}
    )
    assert len(full[0]) == 2 and best.json() == [full[0][:1], full[1][:1]]
    same = await client.post(
        "/embed", json={"inputs": "a", "normalize": False, "parameters": {"normalize": False}}
    )
    assert same.status_code == 200
    cases = [  # a key the route lacks, or given twice, is refused by name; TEI would drop them all
        ("/embed", {"parameters": {"dimensions": 8}}, "parameters.dimensions"),
        ("/embed", {"parameters": {"inputs": "b"}}, "parameters.inputs"),
        ("/predict", {"parameters": {"function_to_apply": "none"}}, "parameters.function_to_apply"),
        ("/predict", {"parameters": {"top_k": 3}}, "top_k must be between 1 and 2"),
        ("/embed", {"normalize": True, "parameters": {"normalize": False}}, "normalize is given twice"),
        ("/embed", {"parameters": ["normalize"]}, "parameters must be an object"),
        ("/embed", {"parameters": {"normalize": "no"}}, "normalize"),
    ]
    for path, extra, words in cases:
        reply = await client.post(path, json={"inputs": "a", **extra})
        assert reply.status_code == 422 and words in reply.text, (path, extra, reply.text)
    # Native routes take no envelope.
    native = await client.post("/classify", json={"text": "a", "parameters": {}})
    assert native.status_code == 422 and "parameters" in native.text


async def test_decode_gives_back_the_text_tokenize_read(served):
    _, client = served
    text = "mary won the game"
    tokens = (await client.post("/tokenize", json={"inputs": text})).json()[0]
    ids = [t["id"] for t in tokens]
    one = await client.post("/decode", json={"ids": ids})
    kept = await client.post("/decode", json={"ids": ids, "skip_special_tokens": False})
    batch = await client.post("/decode", json={"ids": [ids, ids[1:2]], "model": "ner"})
    assert one.status_code == 200 and one.json() == [text]
    assert kept.json()[0].startswith(tokens[0]["text"]) and kept.json()[0].endswith(tokens[-1]["text"])
    assert batch.json() == [text, tokens[1]["text"]]
    vocab = max(ids) + 10**6
    for body, field in [
        ({"ids": [ids[0], vocab]}, "ids.1"),
        ({"ids": [[ids[0]], [ids[0], vocab]]}, "ids.1.1"),
        ({"ids": [-1]}, "ids"),
        ({"ids": []}, "ids"),
        ({"ids": [1], "model": "nope"}, "model"),
    ]:
        reply = await client.post("/decode", json=body)
        assert reply.status_code in (404, 422) and field in [f["field"] for f in reply.json()["fields"]], (
            body,
            reply.text,
        )


async def test_info_describes_a_model_as_tei_does(served):
    app, client = served
    default = (await client.get("/info")).json()
    classify = (await client.get("/info", params={"model": "classify"})).json()
    unknown = await client.get("/info", params={"model": "nope"})
    settings = app.state.service_state.settings
    assert default["model_id"] == "embed" and default["model_type"] == {"embedding": {"pooling": "mean"}}
    assert default["max_input_length"] == MAX_SEQ_LEN and default["model_dtype"] in ("float32", "int8")
    assert default["max_client_batch_size"] == settings.max_batch_items and default["auto_truncate"] is True
    labels = classify["model_type"]["classifier"]
    assert labels["label2id"] == {label: int(i) for i, label in labels["id2label"].items()}
    assert unknown.status_code == 404 and unknown.json()["error"] == "no_model"


async def test_the_root_needs_the_key_and_the_sagemaker_probe_does_not(make_models_dir):
    async with serving(make_models_dir(("embed",)), api_key="k") as (_, client):
        refused = [
            await client.get("/"),
            await client.post("/", json={"inputs": "a"}),
            await client.get("/info"),
        ]
        keyed = await client.post("/", json={"inputs": "a"}, headers={"authorization": "Bearer k"})
        probe = await client.get("/ping")
    assert [r.status_code for r in refused] == [401, 401, 401]
    assert keyed.status_code == 200 and probe.status_code == 200


async def test_openai_embeddings_answer_without_v1_too(served):
    _, client = served
    body = {"input": ["a cat", "a dog"], "encoding_format": "base64"}
    plain, versioned = (
        await client.post("/embeddings", json=body),
        await client.post("/v1/embeddings", json=body),
    )
    assert plain.status_code == 200 and plain.json() == versioned.json()
