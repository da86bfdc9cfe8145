"""Several models per task, picked by name: the `model` field, each task's default, 404 for unknown
names, versioned directories, /models and the metrics per model, and cores shared by ten models."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest

from tests.app.conftest import bundle_of, served_file, serving
from tests.conftest import TOPICS

TEXT = "john smith lives in paris and works for the company"


@pytest.fixture
def four_models(app_bundles, other_bundles, tmp_path):
    """Two classify and two NER models side by side (different weights and labels)."""
    root = tmp_path / "models"
    for name, source in {
        "sentiment": app_bundles["classify"],
        "topics": other_bundles["classify"],
        "conll": app_bundles["ner"],
        "wikiner": other_bundles["ner"],
    }.items():
        shutil.copytree(source, root / name)
    return root


async def test_two_classify_and_two_ner_models_are_served_by_name(four_models):
    async with serving(four_models, default_bundles="classify=sentiment") as (_, client):
        topics = await client.post("/classify", json={"text": TEXT, "model": "topics"})
        assert topics.status_code == 200, topics.text
        assert {s["label"] for s in topics.json()["scores"]} == set(TOPICS)
        assert topics.headers["x-model"] == "topics" and len(topics.headers["x-model-version"]) == 12
        sentiment = await client.post("/classify", json={"text": TEXT, "model": "sentiment"})
        assert {s["label"] for s in sentiment.json()["scores"]} == {"negative", "positive"}
        default = await client.post("/classify", json={"text": TEXT})  # DEFAULT_BUNDLES' choice
        assert default.headers["x-model"] == "sentiment" and default.json() == sentiment.json()
        batch = await client.post("/classify", json={"inputs": [{"text": TEXT}], "model": "topics"})
        assert batch.json()["results"][0] == topics.json()

        answers = {}
        for name in ("conll", "wikiner"):
            r = await client.post("/ner", json={"text": TEXT, "aggregation": "none", "model": name})
            assert r.status_code == 200 and r.headers["x-model"] == name, r.text
            answers[name] = [(e["start"], e["entity"], e["score"]) for e in r.json()["entities"]]
        assert answers["conll"] != answers["wikiner"]  # other weights, other answers

        # Two NER models and no default: the request must name one.
        unnamed = await client.post("/ner", json={"text": TEXT})
        assert unnamed.status_code == 422 and unnamed.json()["error"] == "model_required"
        assert (
            "conll, wikiner" in unnamed.json()["message"] and "DEFAULT_BUNDLES" in unnamed.json()["message"]
        )

        unknown = await client.post("/classify", json={"text": TEXT, "model": "imdb"})
        assert unknown.status_code == 404 and unknown.json()["error"] == "no_model"
        assert unknown.json()["fields"][0]["field"] == "model"
        for name in ("sentiment (classify)", "topics (classify)", "conll (ner)", "wikiner (ner)"):
            assert name in unknown.json()["message"]
        wrong_task = await client.post("/ner", json={"text": TEXT, "model": "topics"})
        assert wrong_task.status_code == 404 and "serves classify, not ner" in wrong_task.json()["message"]
        nowhere = await client.post("/qa", json={"question": "who?", "context": "john"})
        assert nowhere.status_code == 404 and "no model serves qa" in nowhere.json()["message"]
        for bad in ("../sentiment", "", "a/b", "x" * 200):
            r = await client.post("/classify", json={"text": TEXT, "model": bad})
            assert r.status_code == 422 and r.json()["fields"][0]["field"] == "model", bad

        listing = (await client.get("/models")).json()
        models = {m["name"]: m for m in listing["models"]}
        assert {n: m["task"] for n, m in models.items()} == {
            "conll": "ner",
            "sentiment": "classify",
            "topics": "classify",
            "wikiner": "ner",
        }
        assert [n for n, m in models.items() if m["default"]] == ["sentiment"]
        assert models["topics"]["labels"] == TOPICS and models["topics"]["status"] == "ready"
        assert models["topics"]["version"] == topics.headers["x-model-version"]
        assert models["topics"]["versions"][0]["status"] == "serving"
        assert all(m["memory_mb"] is not None and m["memory_mb"] >= 0 for m in models.values())
        assert listing["memory_mb"] == pytest.approx(sum(m["memory_mb"] for m in models.values()), abs=0.2)
        assert models["conll"]["limits"]["max_batch_size"] == 32

        metrics = (await client.get("/metrics")).text
        assert 'bert_requests_total{endpoint="/classify",model="topics",status="200"} 2.0' in metrics
        assert 'bert_requests_total{endpoint="/classify",model="sentiment",status="200"} 2.0' in metrics
        assert 'bert_requests_total{endpoint="/classify",model="",status="404"} 1.0' in metrics
        assert 'bert_batch_size_count{model="wikiner",task="ner"} 1.0' in metrics
        assert 'bert_model_ready{model="conll",task="ner"} 1.0' in metrics
        assert 'bert_model_loads_total{model="topics",result="loaded"} 1.0' in metrics


async def test_versioned_layout_serves_the_newest_version_that_verifies(tmp_path, add_version):
    root = tmp_path / "models"
    add_version(root, "sst", "1", labels=["neg@1", "pos@1"])
    add_version(root, "sst", "2", labels=["neg@2", "pos@2"])
    add_version(root, "legacy", None, labels=["neg", "pos"])  # the flat layout still loads
    async with serving(root, default_bundles="classify=sst") as (_, client):
        r = await client.post("/classify", json={"text": TEXT})
        assert r.headers["x-model-version"] == "2" and r.json()["label"].endswith("@2")
        legacy = await client.post("/classify", json={"text": TEXT, "model": "legacy"})
        assert legacy.status_code == 200 and legacy.json()["label"] in ("neg", "pos")

    # A broken newest version at start-up: the previous one serves, and /models says why.
    model = served_file(root / "sst" / "2")
    model.write_bytes(model.read_bytes()[:500])
    async with serving(root, default_bundles="classify=sst") as (_, client):
        r = await client.post("/classify", json={"text": TEXT})
        assert r.headers["x-model-version"] == "1" and r.json()["label"].endswith("@1")
        sst = {m["name"]: m for m in (await client.get("/models")).json()["models"]}["sst"]
        assert sst["status"] == "ready" and sst["version"] == "1"
        rejected = [v for v in sst["versions"] if v["status"] == "rejected"]
        assert [v["version"] for v in rejected] == ["2"] and "truncated" in rejected[0]["error"]


class OverlapCounter:
    """Wraps a runtime: counts how many runs overlap across every model it wraps."""

    def __init__(self, inner, shared: dict):
        self.inner, self.shared = inner, shared

    def run(self, inputs):
        with self.shared["lock"]:
            self.shared["now"] += 1
            self.shared["peak"] = max(self.shared["peak"], self.shared["now"])
        try:
            time.sleep(0.02)  # long enough for runs of other models to pile up without a limit
            return self.inner.run(inputs)
        finally:
            with self.shared["lock"]:
                self.shared["now"] -= 1


async def test_ten_models_share_two_cores_without_oversubscription(tmp_path, add_version, monkeypatch):
    monkeypatch.setattr("app.engine.registry.available_cores", lambda: 2)
    root = tmp_path / "models"
    names = [f"m{i}" for i in range(10)]
    for name in names:
        add_version(root, name)
    shared = {"lock": threading.Lock(), "now": 0, "peak": 0}
    async with serving(root, inline_batch_tokens=0, default_bundles="classify=m0") as (app, client):
        for name in names:
            bundle = bundle_of(app, "classify", name)
            assert bundle.runtime.instances == 2 and bundle.threads == 1  # a session per core each
            bundle.batcher.runtime = OverlapCounter(bundle.batcher.runtime, shared)
        requests = [
            client.post("/classify", json={"text": f"{TEXT} {n}", "model": name})
            for n in range(3)
            for name in names
        ]
        responses = await asyncio.gather(*requests)
        assert all(r.status_code == 200 for r in responses)
        models = (await client.get("/models")).json()["models"]
        assert {m["intra_op_threads"] for m in models} == {1} and {m["instances"] for m in models} == {2}
    # Ten models with work queued, but never more batches at once than the two cores.
    assert shared["peak"] == 2
