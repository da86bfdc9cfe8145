"""The response cache (RESPONSE_CACHE_MB): the LRU itself, then through the app: keys, headers, metrics,
errors never stored, and a model swap never answered from the old version."""

from __future__ import annotations

import json

import pytest

from app.api.cache import Entry, Key, ResponseCache, canonical, cost
from app.api.native_schemas import ClassifyRequest
from app.observe.metrics import Metrics
from tests.app.conftest import relabel, serving

ADMIN = "admin-key-for-cache-tests"


def key(i: int, model: str = "m", version: str = "1") -> Key:
    return Key(model, version, "/classify", f'{{"text":"{i}"}}')


def entry(size: int) -> Entry:
    return Entry(b"x" * size, ())


def test_lru_evicts_the_least_recently_used_until_it_fits():
    metrics = Metrics()
    one = cost(key(0), entry(100))
    cache = ResponseCache(3 * one, metrics)
    for i in range(3):
        cache.put(key(i), entry(100))
    assert len(cache) == 3 and cache.bytes == 3 * one
    assert cache.get(key(0)) is not None  # 0 is now the most recently used
    cache.put(key(3), entry(100))  # evicts 1, the least recently used
    assert cache.get(key(1)) is None and cache.get(key(0)) is not None and cache.get(key(3)) is not None
    big = key(4, model="other")
    cache.put(big, entry(2 * one - len(big.request)))  # takes two slots: evicts 2 and 0, keeps 3
    assert len(cache) == 2 and cache.bytes == 3 * one
    assert cache.get(key(3)) is not None and cache.get(key(0)) is None
    text = metrics.render().decode()
    assert 'bert_cache_evictions_total{model="m"} 3.0' in text
    assert 'bert_cache_hits_total{model="m"} 4.0' in text and 'bert_cache_misses_total{model="m"} 2.0' in text
    assert f"bert_cache_bytes {float(cache.bytes)}" in text


def test_an_entry_larger_than_the_budget_is_not_stored_and_replacing_keeps_the_count():
    cache = ResponseCache(1000)
    cache.put(key(0), entry(2000))
    assert len(cache) == 0 and cache.bytes == 0
    cache.put(key(0), entry(10))
    cache.put(key(0), entry(20))
    assert len(cache) == 1 and cache.bytes == cost(key(0), entry(20))


def test_drop_version_forgets_only_that_version():
    cache = ResponseCache(10_000)
    for i in range(3):
        cache.put(key(i, version="1"), entry(10))
        cache.put(key(i, version="2"), entry(10))
        cache.put(key(i, model="n", version="1"), entry(10))
    assert cache.drop_version("m", "1") == 3
    assert cache.get(key(0, version="1")) is None and cache.get(key(0, version="2")) is not None
    assert cache.get(key(0, model="n", version="1")) is not None
    assert cache.bytes == 6 * cost(key(0), entry(10))


def test_canonical_requests_ignore_what_does_not_change_the_answer():
    a = ClassifyRequest.model_validate({"text": "a film", "top_k": 2})
    b = ClassifyRequest.model_validate({"top_k": 2, "text": "a film", "timeout_ms": 50, "priority": "high"})
    c = ClassifyRequest.model_validate({"text": "a film", "top_k": 1})
    assert canonical(a) == canonical(b) != canonical(c)
    assert json.loads(canonical(a))["text"] == "a film" and "timeout_ms" not in canonical(a)


ROUTES = {
    "/classify": {"text": "a wonderful, moving film"},
    "/ner": {"text": "John Smith lives in Paris."},
    "/qa": {"question": "where does john live?", "context": "john lives in paris."},
    "/multiple-choice": {"context": "the glass fell and it", "choices": ["broke", "sang"]},
    "/embed": {"inputs": ["the cat sat", "x " * 200]},
    "/v1/embeddings": {"input": "the cat sat", "encoding_format": "base64"},
    "/similarity": {"inputs": {"source_sentence": "a cat", "sentences": ["a dog", "a car"]}},
}


async def test_every_cached_route_answers_byte_for_byte_as_without_the_cache(served, models_dir):
    plain = {path: await served[1].post(path, json=body) for path, body in ROUTES.items()}
    async with serving(models_dir, response_cache_mb=1) as (_, client):
        for path, body in ROUTES.items():
            first = await client.post(path, json=body)
            again = await client.post(path, json={**body, "timeout_ms": 30_000})
            assert first.status_code == again.status_code == plain[path].status_code == 200, first.text
            assert first.headers["x-cache"] == "miss" and again.headers["x-cache"] == "hit", path
            assert first.content == again.content == plain[path].content, path
            for header in ("x-model", "x-model-version", "x-truncated-inputs", "x-windowed-inputs"):
                assert again.headers.get(header) == plain[path].headers.get(header), (path, header)
            assert again.headers["content-type"] == "application/json"
        metrics = (await client.get("/metrics")).text
        assert 'bert_cache_hits_total{model="classify"} 1.0' in metrics
        assert 'bert_cache_misses_total{model="embed"} 3.0' in metrics  # /embed, /v1/embeddings, /similarity


async def test_errors_are_never_cached_and_the_cache_is_off_by_default(served, models_dir):
    async with serving(models_dir, response_cache_mb=1) as (app, client):
        for _ in range(2):
            r = await client.post("/qa", json={"question": "who?", "context": "x", "top_k": 50})
            assert r.status_code == 422 and "x-cache" not in r.headers
        assert len(app.state.service_state.cache) == 0
        assert "bert_cache_hits_total{" not in (await client.get("/metrics")).text
    app, client = served
    r = await client.post("/classify", json=ROUTES["/classify"])
    assert r.status_code == 200 and "x-cache" not in r.headers
    assert app.state.service_state.cache is None


@pytest.mark.parametrize("how", ["admin", "poll"])
async def test_a_swapped_model_never_answers_from_the_old_version(tmp_path, add_version, how):
    root = tmp_path / "models"
    root.mkdir()
    add_version(root, "sentiment", "1", labels=["bad", "good"])
    request = {"text": "a wonderful, moving film", "model": "sentiment"}
    settings = {"response_cache_mb": 1, "admin_api_key": ADMIN}
    async with serving(root, **settings) as (app, client):
        v1 = await client.post("/classify", json=request)
        assert (await client.post("/classify", json=request)).headers["x-cache"] == "hit"
        assert {s["label"] for s in v1.json()["scores"]} == {"bad", "good"}
        add_version(root, "sentiment", "2", labels=["worse", "better"])
        path = "/admin/models/sentiment/load" if how == "admin" else "/admin/poll"
        r = await client.post(path, headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200, r.text
        v2 = await client.post("/classify", json=request)
        assert (
            v2.status_code == 200 and v2.headers["x-model-version"] == "2" and v2.headers["x-cache"] == "miss"
        )
        assert {s["label"] for s in v2.json()["scores"]} == {"worse", "better"}
        cache = app.state.service_state.cache
        assert all(k.version == "2" for k in cache._entries), "the retired version's answers are dropped"


async def test_a_relabelled_flat_bundle_is_a_new_version_and_a_new_key(tmp_path, add_version):
    """A flat bundle's version is its manifest's hash: changing it changes the key too."""
    root = tmp_path / "models"
    root.mkdir()
    target = add_version(root, "sentiment", labels=["bad", "good"])
    async with serving(root, response_cache_mb=1, admin_api_key=ADMIN) as (_, client):
        first = await client.post("/classify", json={"text": "fine", "model": "sentiment"})
        relabel(target, ["low", "high"])
        r = await client.post("/admin/models/sentiment/load", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200, r.text
        second = await client.post("/classify", json={"text": "fine", "model": "sentiment"})
        assert second.headers["x-model-version"] != first.headers["x-model-version"]
        assert second.headers["x-cache"] == "miss" and second.json()["label"] in ("low", "high")


async def test_an_answer_finished_by_a_swapped_out_version_is_not_stored(tmp_path, add_version):
    import asyncio

    from tests.app.conftest import bundle_of
    from tests.app.test_model_control import entered, hold

    root = tmp_path / "models"
    root.mkdir()
    add_version(root, "sentiment", "1", labels=["bad", "good"])
    request = {"text": "a wonderful, moving film", "model": "sentiment"}
    async with serving(root, response_cache_mb=1, admin_api_key=ADMIN) as (app, client):
        gate = hold(bundle_of(app, "classify", "sentiment"))
        pending = asyncio.create_task(client.post("/classify", json=request))
        await entered(gate)  # admitted on version 1, held in its batch
        add_version(root, "sentiment", "2", labels=["worse", "better"])
        r = await client.post("/admin/models/sentiment/load", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200, r.text
        gate.release.set()
        old = await pending
        assert old.status_code == 200 and old.headers["x-model-version"] == "1"
        assert old.headers["x-cache"] == "miss"
        cache = app.state.service_state.cache
        assert not any(k.version == "1" for k in cache._entries)
        new = await client.post("/classify", json=request)
        assert new.headers["x-model-version"] == "2" and new.json()["label"] in ("worse", "better")
