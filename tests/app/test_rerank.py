"""Reranking as text-embeddings-inference (/rerank) and Infinity (/v1/rerank) speak it, on classify
models of text pairs: the scores are /classify's on the same pairs, bit for bit, the pairs go to the
classify model's batcher, and every bad request is a 4xx naming its field."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path

import pytest

from export.bundle import load_bundle_manifest, write_manifest

from .conftest import bundle_of, serving

QUERY = "where is the house"
TEXTS = ["the house is in the city", "mary won the game", "the team sat on the mat", "where is mary"]
LONG = "the cat sat on the mat and " * 20  # 140 tokens of the tiny vocabulary, beyond MAX_SEQ_LEN


def add_model(
    root: Path,
    source: Path,
    name: str,
    labels: list[str] | None = None,
    pairs: bool = False,
    reranker: bool = False,
) -> None:
    """A copy of a tiny bundle, relabelled, marked as reading text pairs or as a reranker
    (bundle.json lists no hash of itself)."""
    shutil.copytree(source, root / name)
    manifest = load_bundle_manifest(root / name)
    if labels:
        manifest.labels = labels
    if pairs:
        manifest.preprocessing["text_pair"] = True
    manifest.reranker = reranker
    write_manifest(root / name, manifest)


@pytest.fixture
def rerank_dir(app_bundles, other_bundles, regression_bundle, tmp_path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    add_model(root, app_bundles["classify"], "ranker", ["irrelevant", "relevant"], pairs=True)
    add_model(root, app_bundles["classify"], "nli", ["entailment", "not_entailment"])  # GLUE's order
    add_model(root, regression_bundle, "sts")
    add_model(root, other_bundles["classify"], "topics")  # three labels: no relevance score
    add_model(root, app_bundles["ner"], "ner")
    return root


async def post(client, path, body, status=200):
    response = await client.post(path, json=body)
    assert response.status_code == status, response.text
    return response


async def classified(client, model: str, texts: list[str]) -> list[dict]:
    body = {"model": model, "inputs": [{"text": QUERY, "text_pair": t} for t in texts]}
    return (await post(client, "/classify", body)).json()["results"]


def v2_pairs(texts: list[str]) -> dict:
    rows = [len(texts)]
    return {
        "inputs": [
            {"name": "text", "shape": rows, "datatype": "BYTES", "data": [QUERY] * len(texts)},
            {"name": "text_pair", "shape": rows, "datatype": "BYTES", "data": texts},
        ],
        "outputs": [{"name": "scores"}],
    }


def score_of(result: dict, label: str) -> float:
    return next(s["score"] for s in result["scores"] if s["label"] == label)


async def test_rerank_scores_are_classify_s_positive_probability(rerank_dir):
    """TEI's body as its clients send it; scores equal /classify's bit for bit, best first."""
    async with serving(rerank_dir, default_bundles="classify=nli") as (_, client):
        body = {"query": QUERY, "texts": TEXTS, "truncate": False, "truncation_direction": "Right"}
        body.update(raw_scores=False, return_text=True)
        reply = await post(client, "/rerank", body)  # no model: nli is no pair model, ranker is
        bare = (await post(client, "/rerank", {"query": QUERY, "texts": TEXTS})).json()
        results = await classified(client, "ranker", TEXTS)
        nli = (await post(client, "/rerank", {"query": QUERY, "texts": TEXTS, "model": "nli"})).json()
        nli_results = await classified(client, "nli", TEXTS)
        v2 = await post(client, "/v2/models/ranker/infer", v2_pairs(TEXTS))
    ranks = reply.json()
    assert reply.headers["x-model"] == "ranker"
    assert sorted(r["index"] for r in ranks) == list(range(len(TEXTS)))
    assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
    assert all(r["text"] == TEXTS[r["index"]] for r in ranks)
    assert all(set(r) == {"index", "score"} for r in bare)  # TEI leaves text out unless asked
    assert {r["index"]: r["score"] for r in ranks} == {
        i: score_of(result, "relevant") for i, result in enumerate(results)
    }
    # How a V2 client reranks (docs/protocols.md): the pairs as rows, the positive label's probability.
    rows = [json.loads(row) for row in v2.json()["outputs"][0]["data"]]
    assert [score_of({"scores": row}, "relevant") for row in rows] == [
        score_of(result, "relevant") for result in results
    ]
    # GLUE's RTE/QNLI label order: the label named "entailment" is the positive one, though first.
    assert {r["index"]: r["score"] for r in nli} == {
        i: score_of(result, "entailment") for i, result in enumerate(nli_results)
    }


async def test_raw_scores_are_the_positive_logit(rerank_dir):
    async with serving(rerank_dir, default_bundles="classify=ranker") as (_, client):
        raw = (await post(client, "/rerank", {"query": QUERY, "texts": TEXTS, "raw_scores": True})).json()
        logits = await post(client, "/predict", {"inputs": [[QUERY, t] for t in TEXTS], "raw_scores": True})
        probs = (await post(client, "/predict", {"inputs": [[QUERY, t] for t in TEXTS]})).json()
        sts = (await post(client, "/rerank", {"query": QUERY, "texts": TEXTS, "model": "sts"})).json()
        sts_raw = await post(
            client, "/rerank", {"query": QUERY, "texts": TEXTS, "model": "sts", "raw_scores": True}
        )
        values = [r["value"] for r in await classified(client, "sts", TEXTS)]
    rows = [{p["label"]: p["score"] for p in row} for row in logits.json()]
    for r in raw:
        assert r["score"] == rows[r["index"]]["relevant"]
    for row, prob in zip(rows, probs, strict=True):  # softmax of the raw scores is the probability
        p = 1 / (1 + math.exp(row["irrelevant"] - row["relevant"]))
        assert p == pytest.approx({q["label"]: q["score"] for q in prob}["relevant"], rel=1e-6)
    # One output: the sigmoid of /classify's value; raw_scores, the value itself.
    assert {r["index"]: r["score"] for r in sts} == {i: 1 / (1 + math.exp(-v)) for i, v in enumerate(values)}
    assert {r["index"]: r["score"] for r in sts_raw.json()} == dict(enumerate(values))
    assert sts_raw.headers["x-model"] == "sts"


async def test_infinity_shape(rerank_dir):
    """Infinity's client body: its default model string, top_n, return_documents, usage."""
    body = {"query": QUERY, "documents": TEXTS, "return_documents": False, "raw_scores": False}
    async with serving(rerank_dir, default_bundles="classify=nli") as (_, client):
        full = await post(client, "/v1/rerank", {**body, "model": "default/not-specified"})
        top = await post(
            client, "/v1/rerank", {**body, "model": "ranker", "top_n": 2, "return_documents": True}
        )
        big = await post(client, "/v1/rerank", {**body, "top_n": 99})
        tei = (await post(client, "/rerank", {"query": QUERY, "texts": TEXTS})).json()
    out = full.json()
    assert out["object"] == "rerank" and out["model"] == "ranker" and out["id"] and out["created"] > 0
    assert [(r["index"], r["relevance_score"]) for r in out["results"]] == [
        (r["index"], r["score"]) for r in tei
    ]
    assert all(r["document"] is None for r in out["results"])
    assert (
        out["usage"]["prompt_tokens"] == out["usage"]["total_tokens"] == int(full.headers["x-compute-tokens"])
    )
    assert out["usage"]["prompt_tokens"] > len(TEXTS) * 3  # each pair: query, text, [CLS], 2 [SEP]
    best = top.json()["results"]
    assert best == [{**r, "document": TEXTS[r["index"]]} for r in out["results"][:2]]
    assert len(big.json()["results"]) == len(TEXTS)


async def test_rerank_pairs_go_to_the_classify_batcher(rerank_dir):
    """The same batcher as /classify's: alone or beside concurrent /classify work, the same scores."""
    async with serving(rerank_dir, default_bundles="classify=ranker") as (app, client):
        batcher = bundle_of(app, "classify", "ranker").batcher
        submitted: list[int] = []
        submit = batcher.submit

        def counting(items, schedule=None):
            submitted.append(len(items))
            return submit(items, schedule)

        batcher.submit = counting
        alone = (await post(client, "/rerank", {"query": QUERY, "texts": TEXTS})).json()
        together = await asyncio.gather(
            *(post(client, "/rerank", {"query": QUERY, "texts": TEXTS}) for _ in range(3)),
            *(post(client, "/classify", {"text": t}) for t in TEXTS),
        )
    assert submitted[0] == len(TEXTS)  # one work item per pair, into the classify model's batcher
    assert len(submitted) == 1 + 3 + len(TEXTS)
    assert all(r.json() == alone for r in together[:3])


async def test_bad_rerank_requests_are_4xx_naming_the_field(rerank_dir):
    ok = {"query": QUERY, "texts": TEXTS}
    async with serving(rerank_dir, default_bundles="classify=nli", max_batch_items=3) as (_, client):
        cases = [
            ({**ok, "texts": TEXTS[:3], "model": "topics"}, 422, "not_a_reranker", "model"),
            ({**ok, "texts": TEXTS[:3], "model": "ner"}, 404, "no_model", "model"),
            ({**ok, "texts": TEXTS[:3], "model": "nope"}, 404, "no_model", "model"),
            ({**ok, "texts": []}, 422, "invalid_request", "texts"),
            ({**ok, "texts": ["a house", " "]}, 422, "invalid_request", "texts.1"),
            ({**ok, "query": ""}, 422, "invalid_request", "query"),
            ({"texts": TEXTS[:2]}, 422, "invalid_request", "query"),
            (ok, 422, "too_many_inputs", "texts"),
            (
                {**ok, "texts": TEXTS[:2], "truncation_direction": "left"},
                422,
                "invalid_request",
                "truncation_direction",
            ),
            ({**ok, "texts": TEXTS[:2], "truncate": "no"}, 422, "invalid_request", "truncate"),
            ({**ok, "texts": ["mary", LONG], "truncate": False}, 413, "input_too_long", "texts.1"),
            ({**ok, "text": "typo"}, 422, "invalid_request", "text"),
        ]
        for body, status, code, field in cases:
            reply = (await post(client, "/rerank", body, status)).json()
            assert reply["error"] == code and field in [f["field"] for f in reply["fields"]], (body, reply)
        infinity = [
            ({"query": QUERY, "documents": TEXTS[:2], "top_n": 0}, "top_n"),
            ({"query": QUERY, "documents": []}, "documents"),
            ({"query": QUERY, "documents": TEXTS[:2], "texts": TEXTS[:2]}, "texts"),
        ]
        for body, field in infinity:
            reply = (await post(client, "/v1/rerank", body, 422)).json()
            assert field in [f["field"] for f in reply["fields"]], reply
        cut = await post(client, "/rerank", {**ok, "texts": ["mary", LONG]})  # /classify's rule: cut
        kept = await post(client, "/rerank", {**ok, "texts": ["mary", LONG], "truncate": True})
        assert cut.headers["x-truncated-inputs"] == "1" and cut.json() == kept.json()
        message = (await post(client, "/rerank", {**ok, "texts": ["mary"], "model": "topics"}, 422)).json()
        assert "3 labels" in message["message"] and "topics" in message["message"]


async def test_without_a_pair_model_a_rerank_request_must_name_one(make_models_dir):
    """TEI serves one model; here the classify default reranks only if its bundle reads pairs."""
    async with serving(make_models_dir(("classify", "embed"))) as (_, client):
        refused = (await post(client, "/rerank", {"query": QUERY, "texts": TEXTS}, 422)).json()
        named = await post(client, "/rerank", {"query": QUERY, "texts": TEXTS, "model": "classify"})
        infinity = await post(client, "/v1/rerank", {"query": QUERY, "documents": TEXTS}, 422)
    assert refused["error"] == "model_required" and "DEFAULT_BUNDLES=rerank=" in refused["message"]
    assert named.headers["x-model"] == "classify" and len(named.json()) == len(TEXTS)
    assert infinity.json()["error"] == "model_required"


def test_default_bundles_names_a_reranker_among_the_classify_models():
    from app.settings import Settings, parse_default_bundles

    assert parse_default_bundles("rerank=ranker,classify=sst2") == {"rerank": "ranker", "classify": "sst2"}
    with pytest.raises(ValueError, match="rerank"):
        Settings(default_bundles="reranker=ranker")


def test_a_checkpoint_s_text_pair_key_reaches_the_bundle():
    """What marks a pair model: config.json's `text_pair`, copied by export into `preprocessing`."""
    from types import SimpleNamespace

    from export.checkpoint_fields import preprocessing_rules

    config = SimpleNamespace(extra={"text_pair": True, "window_overlap": 15, "architectures": ["x"]})
    assert preprocessing_rules(config, "classify") == {"text_pair": True, "window_overlap": 15}


RANKER_LABELS = ["not_relevant", "relevant"]


async def defaults_served(client) -> tuple[str, str, str]:
    """Which models /classify, /rerank and /v1/rerank use when the request names none."""
    classify = await post(client, "/classify", {"inputs": [{"text": QUERY}]})
    tei = await post(client, "/rerank", {"query": QUERY, "texts": TEXTS})
    infinity = await post(client, "/v1/rerank", {"query": QUERY, "documents": TEXTS})
    return classify.headers["x-model"], tei.headers["x-model"], infinity.json()["model"]


async def test_a_bundle_marked_reranker_is_rerank_s_default_and_not_classify_s(app_bundles, tmp_path):
    """`make serve` on the defaults: sst2 answers /classify and the reranker /rerank, with no
    DEFAULT_BUNDLES; the reranker still classifies by name, and DEFAULT_BUNDLES always wins."""
    add_model(tmp_path, app_bundles["classify"], "sst2")
    add_model(tmp_path, app_bundles["classify"], "ranker", RANKER_LABELS, reranker=True)
    add_model(tmp_path, app_bundles["embed"], "embedder")
    async with serving(tmp_path) as (_, client):
        assert await defaults_served(client) == ("sst2", "ranker", "ranker")
        named = await post(client, "/classify", {"model": "ranker", "inputs": [{"text": QUERY}]})
        assert named.headers["x-model"] == "ranker"
        listed = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
        assert (listed["sst2"]["default"], listed["sst2"]["rerank_default"]) == (True, False)
        assert (listed["ranker"]["default"], listed["ranker"]["rerank_default"]) == (False, True)
        assert listed["embedder"]["rerank_default"] is False
    async with serving(tmp_path, default_bundles="classify=ranker,rerank=sst2") as (_, client):
        assert await defaults_served(client) == ("ranker", "sst2", "sst2")


async def test_two_rerankers_leave_rerank_without_a_default(app_bundles, tmp_path):
    add_model(tmp_path, app_bundles["classify"], "sst2")
    add_model(tmp_path, app_bundles["classify"], "ranker", RANKER_LABELS, pairs=True, reranker=True)
    add_model(tmp_path, app_bundles["classify"], "ranker2", RANKER_LABELS, pairs=True, reranker=True)
    async with serving(tmp_path) as (_, client):
        classify = await post(client, "/classify", {"inputs": [{"text": QUERY}]})
        refused = (await post(client, "/rerank", {"query": QUERY, "texts": TEXTS}, 422)).json()
        chosen = await post(client, "/rerank", {"query": QUERY, "texts": TEXTS, "model": "ranker2"})
        listed = (await client.get("/models")).json()["models"]
    assert classify.headers["x-model"] == "sst2"
    assert refused["error"] == "model_required" and "ranker, ranker2" in refused["message"]
    assert not any(m["rerank_default"] for m in listed)  # none while the choice is ambiguous
    assert chosen.headers["x-model"] == "ranker2"


async def test_a_lone_reranker_is_also_classify_s_default(app_bundles, tmp_path):
    add_model(tmp_path, app_bundles["classify"], "ranker", RANKER_LABELS, reranker=True)
    async with serving(tmp_path) as (_, client):
        assert await defaults_served(client) == ("ranker", "ranker", "ranker")


def test_the_reranker_role_comes_from_training_or_the_export_option():
    """Training on squad-sentences pairs records `reranker` in config.json; export copies it into
    the manifest unless told otherwise (--reranker / --no-reranker, a defaults.json entry)."""
    from types import SimpleNamespace

    from export.checkpoint_fields import is_reranker
    from export.onnx_export import ExportError

    trained = SimpleNamespace(extra={"reranker": True})
    plain = SimpleNamespace(extra={})
    assert is_reranker(trained, "classify", None) and not is_reranker(plain, "classify", None)
    assert is_reranker(plain, "classify", True) and not is_reranker(trained, "classify", False)
    with pytest.raises(ExportError, match="only a classify model"):
        is_reranker(plain, "ner", True)
