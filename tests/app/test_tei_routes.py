"""TEI's /predict on the classify service, TEI's timing headers on every inference route, OpenAI's
/v1/models, and what /v1/embeddings does with a model name it does not know."""

from __future__ import annotations

import math
import shutil

import pytest

from .conftest import serving

LONG = "the cat sat on the mat and " * 20  # 140 tokens of the tiny vocabulary, beyond MAX_SEQ_LEN
TEI_HEADERS = (
    "x-compute-time",
    "x-compute-characters",
    "x-compute-tokens",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
)


async def post(client, path, body, status=200):
    response = await client.post(path, json=body)
    assert response.status_code == status, response.text
    return response


def scores(result: dict) -> list[dict]:
    return [{"score": s["score"], "label": s["label"]} for s in result["scores"]]


@pytest.fixture
def predict_dir(make_models_dir, regression_bundle):
    root = make_models_dir(("classify",))
    shutil.copytree(regression_bundle, root / "sts")
    return root


async def test_predict_answers_tei_shapes_with_classify_s_scores(predict_dir):
    async with serving(predict_dir, classify_long_text="windows", default_bundles="classify=classify") as (
        _,
        client,
    ):
        one = (await post(client, "/predict", {"inputs": "a great film"})).json()
        listed = (await post(client, "/predict", {"inputs": ["a great film"]})).json()
        pair = (await post(client, "/predict", {"inputs": ["a great film", "boring"]})).json()
        batch = (
            await post(client, "/predict", {"inputs": [["a great film"], ["a great film", "boring"]]})
        ).json()
        raw = (await post(client, "/predict", {"inputs": "a great film", "raw_scores": True})).json()
        text = (await post(client, "/classify", {"text": "a great film"})).json()
        text_pair = (await post(client, "/classify", {"text": "a great film", "text_pair": "boring"})).json()
        windowed = await post(client, "/predict", {"inputs": [["mary"], [LONG]]})
        long_text = (await post(client, "/classify", {"text": LONG})).json()
        cut = await post(client, "/predict", {"inputs": LONG, "truncate": True})
        sts = (await post(client, "/predict", {"inputs": ["a great film", "boring"], "model": "sts"})).json()
        value = await post(
            client, "/classify", {"text": "a great film", "text_pair": "boring", "model": "sts"}
        )
    assert one == listed == scores(text) and len(one) == 2  # every label, best first
    assert one[0]["score"] >= one[1]["score"]
    assert pair == scores(text_pair)
    assert batch == [one, pair]
    by_label = {p["label"]: p["score"] for p in raw}  # logits: softmax gives the probabilities back
    positive = 1 / (1 + math.exp(by_label["negative"] - by_label["positive"]))
    assert positive == pytest.approx({p["label"]: p["score"] for p in one}["positive"], rel=1e-6)
    assert [p["score"] for p in raw] == sorted(by_label.values(), reverse=True)
    # CLASSIFY_LONG_TEXT=windows: as /classify reads it, and the header says so; truncate cuts it.
    assert windowed.json()[1] == scores(long_text) and long_text["windows"] > 1
    assert windowed.headers["x-windowed-inputs"] == f"1={long_text['windows']}"
    assert cut.headers["x-truncated-inputs"] == "0" and "x-windowed-inputs" not in cut.headers
    assert sts == [{"score": value.json()["value"], "label": "similarity"}]  # regression: the value


async def test_bad_predict_requests_are_4xx_naming_the_field(make_models_dir):
    async with serving(make_models_dir(("classify",)), max_batch_items=3) as (_, client):
        cases = [
            ({"inputs": ["a", "b", "c"]}, 422, "inputs", "list of lists"),
            ({"inputs": []}, 422, "inputs", "a pair"),
            ({"inputs": [["a", "b", "c"]]}, 422, "inputs", "inputs.0 has 3 strings"),
            ({"inputs": [["a"], []]}, 422, "inputs", "inputs.1 has 0 strings"),
            ({"inputs": ["a", " "]}, 422, "inputs", "inputs.1: must not be empty"),
            ({"inputs": ""}, 422, "inputs", "must not be empty"),
            ({"inputs": [["a"], ["b"], ["c"], ["d"]]}, 422, "inputs", "limit is 3"),
            ({"inputs": "a", "truncation_direction": "left"}, 422, "truncation_direction", "right"),
            ({"inputs": "a", "raw_scores": 1}, 422, "raw_scores", ""),
            ({"inputs": [["a"], [LONG]], "truncate": False}, 413, "inputs.1.0", "tokens"),
            ({"inputs": ["a", LONG], "truncate": False}, 413, "inputs.1", "with inputs.0"),
            ({"inputs": "a", "model": "nope"}, 404, "model", "nope"),
        ]
        for body, status, field, words in cases:
            reply = (await post(client, "/predict", body, status)).json()
            assert field in [f["field"] for f in reply["fields"]] and words in reply["message"], (body, reply)


INFERENCE = [
    ("/classify", {"text": "a great film"}),
    ("/ner", {"text": "mary won the game"}),
    ("/multiple-choice", {"context": "the cat sat", "choices": ["on the mat", "in the house"]}),
    ("/qa", {"question": "where is mary", "context": "mary is in the house"}),
    ("/embed", {"inputs": ["a great film", "boring"]}),
    ("/v1/embeddings", {"input": "a great film"}),
    ("/similarity", {"inputs": {"source_sentence": "a cat", "sentences": ["a dog", "the mat"]}}),
    ("/predict", {"inputs": "a great film"}),
    ("/rerank", {"query": "a film", "texts": ["a great film", "boring"], "model": "classify"}),
    ("/v1/rerank", {"query": "a film", "documents": ["a great film"], "model": "classify"}),
    (
        "/v2/models/classify/infer",
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a great film", "boring"]}]},
    ),
]


async def test_every_inference_answer_carries_tei_s_timing_headers(models_dir):
    async with serving(models_dir) as (_, client):
        replies = {path: await post(client, path, body) for path, body in INFERENCE}
        tokens = await post(client, "/tokenize", {"inputs": "a great film"})
        metrics = (await client.get("/metrics")).text
    for path, reply in replies.items():
        values = {name: reply.headers[name] for name in TEI_HEADERS}
        assert all(v.isdigit() for v in values.values()), (path, values)  # whole milliseconds
        ms = {name: int(v) for name, v in values.items()}
        assert ms["x-total-time"] == ms["x-compute-time"] >= ms["x-inference-time"], (path, ms)
        assert ms["x-total-time"] >= max(ms["x-tokenization-time"], ms["x-queue-time"]), (path, ms)
        assert ms["x-compute-tokens"] > 0 and ms["x-compute-characters"] > 0, (path, ms)
        assert "inference;dur=" in reply.headers["server-timing"]  # kept beside them
    classify = replies["/classify"].headers
    assert int(classify["x-compute-characters"]) == len("a great film")
    assert int(classify["x-compute-tokens"]) == len(tokens.json()[0])  # [CLS] ... [SEP]
    assert int(replies["/v2/models/classify/infer"].headers["x-compute-characters"]) == len(
        "a great filmboring"
    )
    assert int(replies["/embed"].headers["x-compute-tokens"]) > int(classify["x-compute-tokens"])
    assert "x-compute-time" not in tokens.headers  # no model ran
    assert 'bert_request_tokens_bucket{le="8.0",model="classify",task="classify"}' in metrics


async def test_openai_models_and_embedding_model_names(served):
    _, client = served
    listed = (await client.get("/v1/models")).json()
    ada = (await post(client, "/v1/embeddings", {"input": "a cat", "model": "text-embedding-ada-002"})).json()
    named = (await post(client, "/v1/embeddings", {"input": "a cat", "model": "embed"})).json()
    unknown = (await post(client, "/v1/embeddings", {"input": "a cat", "model": "nope"}, 404)).json()
    other_task = (await post(client, "/v1/embeddings", {"input": "a cat", "model": "classify"}, 404)).json()
    assert listed["object"] == "list"
    tasks = {"classify", "ner", "multiple-choice", "qa", "embed", "sparse"}
    assert {m["id"] for m in listed["data"]} == tasks
    for model in listed["data"]:
        assert model["object"] == "model" and model["owned_by"] and model["created"] > 1_600_000_000
        assert set(model) == {"id", "object", "created", "owned_by"}
    # OpenAI's own names get the embedding default, and the answer names it; others are refused.
    assert ada["model"] == "embed" and ada["data"] == named["data"]
    assert unknown["error"] == "no_model" and "nope" in unknown["message"]
    assert other_task["error"] == "no_model"
