"""Every endpoint against real ONNX bundles exported from tiny models."""

from __future__ import annotations

import math

import pytest

from tests.app.conftest import MAX_SEQ_LEN, TASKS, serving

TEXT = "this movie was great fun"


def stages(response) -> set[str]:
    return {part.split(";")[0].strip() for part in response.headers["server-timing"].split(",")}


async def test_classify_single_and_top_k(served):
    _, client = served
    r = await client.post("/classify", json={"text": TEXT})
    assert r.status_code == 200, r.text
    body = r.json()
    scores = [s["score"] for s in body["scores"]]
    assert {s["label"] for s in body["scores"]} == {"negative", "positive"}
    assert scores == sorted(scores, reverse=True) and math.isclose(sum(scores), 1.0, abs_tol=1e-6)
    assert body["label"] == body["scores"][0]["label"] and body["score"] == scores[0]
    assert body["truncated"] is False and body["windows"] == 1 and body["value"] is None
    assert stages(r) == {"tokenize", "queue", "inference", "postprocess"}
    assert r.headers["x-request-id"]

    top = (await client.post("/classify", json={"text": TEXT, "top_k": 1})).json()
    assert [s["label"] for s in top["scores"]] == [body["label"]]

    pair = await client.post("/classify", json={"text": "good", "text_pair": "bad"})
    assert pair.status_code == 200 and pair.json()["scores"] != body["scores"]


async def test_classify_batch_equals_single_requests(models_dir):
    texts = [{"text": TEXT}, {"text": "boring film", "text_pair": "a terrible movie"}, {"text": "paris"}]
    async with serving(models_dir, cpu_variant="fused") as (_, client):
        batch = await client.post("/classify", json={"inputs": texts, "top_k": 2})
        assert batch.status_code == 200, batch.text
        results = batch.json()["results"]
        assert len(results) == 3
        for one, result in zip(texts, results, strict=True):
            alone = (await client.post("/classify", json=one)).json()
            assert result["label"] == alone["label"]
            assert result["score"] == pytest.approx(alone["score"], abs=1e-5)


async def test_classify_long_text_truncates_or_windows(served, models_dir):
    long_text = " ".join(["great fun movie"] * 60)  # ~180 tokens, windows of 64
    _, client = served
    cut = (await client.post("/classify", json={"text": long_text})).json()
    assert cut["truncated"] is True and cut["windows"] == 1
    exact = " ".join(["fun"] * (MAX_SEQ_LEN - 2))  # fills the window exactly: nothing cut
    assert (await client.post("/classify", json={"text": exact})).json()["truncated"] is False
    async with serving(models_dir, classify_long_text="windows") as (_, client):
        windowed = (await client.post("/classify", json={"text": long_text})).json()
        assert windowed["truncated"] is False and windowed["windows"] >= 3
        assert math.isclose(sum(s["score"] for s in windowed["scores"]), 1.0, abs_tol=1e-6)


async def test_classify_regression(regression_bundle):
    async with serving(regression_bundle.parent) as (_, client):
        body = (await client.post("/classify", json={"text": TEXT})).json()
        assert body["value"] is not None and body["score"] == body["value"]
        assert body["label"] == "similarity" and len(body["scores"]) == 1
        other = (await client.post("/classify", json={"text": "bad boring"})).json()
        assert other["value"] != body["value"]


async def test_ner_offsets_and_aggregations(served):
    text = "John Smith lives in New York and works for the company."
    _, client = served
    for aggregation in ("none", "simple", "first", "average", "max"):
        r = await client.post("/ner", json={"text": text, "aggregation": aggregation})
        assert r.status_code == 200, r.text
        entities = r.json()["entities"]
        assert entities, f"random tiny model found no entity with {aggregation}"
        for e in entities:
            assert text[e["start"] : e["end"]] == e["text"] and 0 < e["score"] <= 1
    default = (await client.post("/ner", json={"text": text})).json()
    first = (await client.post("/ner", json={"text": text, "aggregation": "first"})).json()
    assert default == first
    tokens = (await client.post("/ner", json={"text": text, "aggregation": "none"})).json()["entities"]
    assert all(e["entity"].startswith(("B-", "I-")) for e in tokens)


async def test_multiple_choice(served):
    body = {
        "context": "the cat sat on the mat",
        "question": "where did the cat sit?",
        "choices": ["on the mat", "in the river", "at the house"],
    }
    _, client = served
    r = await client.post("/multiple-choice", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["scores"]) == 3 and math.isclose(sum(out["scores"]), 1.0, abs_tol=1e-6)
    assert out["best"] == max(range(3), key=lambda i: out["scores"][i])
    assert out["choice"] == body["choices"][out["best"]]
    cloze = await client.post("/multiple-choice", json={**body, "question": "the cat sat _ ."})
    assert cloze.status_code == 200
    no_question = await client.post("/multiple-choice", json={**body, "question": None})
    assert no_question.status_code == 200


async def test_qa_answers_point_into_the_context(served):
    context = "john smith lives in paris , the capital of france . " * 8
    _, client = served
    r = await client.post("/qa", json={"question": "where does john live?", "context": context, "top_k": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["windows"] > 1 and len(out["answers"]) == 3
    for a in out["answers"]:
        assert context[a["start"] : a["end"]] == a["text"] and a["text"]
    scores = [a["score"] for a in out["answers"]]
    assert scores == sorted(scores, reverse=True)
    short = await client.post("/qa", json={"question": "who?", "context": "john", "max_answer_len": 1})
    assert short.json()["answers"][0]["text"] == "john"


async def test_openapi_examples_all_work(models_dir):
    """Every request example shown in /docs is accepted as-is (with a reranker: the tiny classify model)."""
    async with serving(models_dir, default_bundles="rerank=classify") as (_, client):
        spec = (await client.get("/openapi.json")).json()
        assert (await client.get("/docs")).status_code == 200
        tried = 0
        for path, item in spec["paths"].items():
            if "post" not in item or "requestBody" not in item["post"]:
                continue  # the admin API's POSTs take no body
            if "{" in path:
                continue  # V2's example needs a model name in the path: tests/app/test_v2.py tries it
            body = item["post"]["requestBody"]["content"]["application/json"]
            if "$ref" in body["schema"]:
                examples = spec["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[-1]][
                    "examples"
                ]
            else:  # a body of several schemas (TEI's root) shows examples of its own
                examples = [example["value"] for example in body["examples"].values()]
            assert examples, f"{path} has no example"
            for example in examples:
                r = await client.post(path, json=example)
                assert r.status_code == 200, (path, example, r.text)
                tried += 1
        assert tried >= 5


async def test_health_models_and_metrics(models_dir):
    async with serving(models_dir) as (_, client):
        assert (await client.get("/health")).json() == {"status": "ok"}
        models = {m["task"]: m for m in (await client.get("/models")).json()["models"]}
        assert set(models) == set(TASKS)
        for m in models.values():
            assert (
                m["status"] == "ready"
                and m["variant"].startswith("int8-rowwise")
                and m["precision"] == "int8"
            )
            assert m["batch_invariant"] is True and "per-token" in m["variant_note"]
            assert m["execution_provider"] == "CPUExecutionProvider" and m["device"] == "cpu"
            assert m["max_seq_len"] == MAX_SEQ_LEN and m["limits"]["max_batch_size"] == 32
        assert models["ner"]["labels"][0] == "O"
        assert set(models["qa"]["qa_defaults"]) == {"doc_stride", "max_query_len", "max_answer_len"}

        await client.post("/classify", json={"text": TEXT})
        await client.post("/qa", json={"question": "who?", "context": "john smith"})
        await client.post("/ner", json={"text": ""})
        text = (await client.get("/metrics")).text
        assert 'bert_requests_total{endpoint="/classify",model="classify",status="200"} 1.0' in text
        assert 'bert_requests_total{endpoint="/ner",model="",status="422"} 1.0' in text
        assert 'bert_request_latency_seconds_count{endpoint="/qa",model="qa"} 1.0' in text
        for stage in ("tokenize", "queue", "inference", "postprocess"):
            assert f'bert_stage_seconds_count{{model="classify",stage="{stage}",task="classify"}} 1.0' in text
        assert 'bert_batch_size_count{model="qa",task="qa"}' in text
        assert 'bert_queue_depth{model="qa",task="qa"} 0.0' in text
        assert "# TYPE bert_rejected_total counter" in text


@pytest.mark.parametrize(
    ("flags", "served"),
    [
        ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, "int8-rowwise"),
        ({"avx", "avx2", "fma"}, "int8-rowwise-avx2"),
    ],
)
async def test_models_serves_and_names_the_variant_for_the_cpu(models_dir, monkeypatch, flags, served):
    """CPU_VARIANT=auto on a VNNI CPU and on an AVX2-only one (flags injected): /models names the
    variant and why, and the -avx2 one answers on the fast kernel (no widening kernel asked)."""
    from export import int8_precision

    monkeypatch.setattr(int8_precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda cpuinfo=None: set(flags))
    async with serving(models_dir) as (app, client):
        models = (await client.get("/models")).json()["models"]
        assert {m["variant"] for m in models} == {served}
        assert all(m["batch_invariant"] is True and m["variant_reason"] for m in models)
        assert all(("16 bits" in m["variant_reason"]) == served.endswith("avx2") for m in models)
        assert (await client.post("/classify", json={"text": TEXT})).status_code == 200


async def test_cpu_variant_setting_picks_the_variant(models_dir):
    async with serving(models_dir, cpu_variant="fp32") as (_, client):
        variants = {m["variant"] for m in (await client.get("/models")).json()["models"]}
        assert variants == {"fp32"}
        assert (await client.post("/classify", json={"text": TEXT})).status_code == 200
    async with serving(models_dir, cpu_variant="int8") as (_, client):  # the opt-in, batch-dependent one
        models = (await client.get("/models")).json()["models"]
        assert {(m["variant"], m["batch_invariant"]) for m in models} == {("int8", False)}
        assert all("one activation scale per batch" in m["variant_note"] for m in models)
        assert (await client.post("/classify", json={"text": TEXT})).status_code == 200
