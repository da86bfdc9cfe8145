"""Live model control: the admin API and its key, atomic version swaps, refused versions, unloading,
the memory limit, and MODEL_POLL_S following MODELS_DIR."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import threading

import pytest
from pydantic import ValidationError

from app.settings import Settings
from tests.app.conftest import bundle_of, served_file, serving, wait_ready

ADMIN_KEY = "admin-test-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TEXT = "a great film"


class Gate:
    """Holds every run of a runtime until released, so requests stay in flight."""

    def __init__(self, inner):
        self.inner, self.entered, self.release = inner, threading.Event(), threading.Event()

    def run(self, inputs):
        self.entered.set()
        assert self.release.wait(20)
        return self.inner.run(inputs)


def hold(bundle) -> Gate:
    gate = Gate(bundle.batcher.runtime)
    bundle.batcher.runtime = gate
    bundle.batcher.inline_tokens = 0  # held in a worker thread: the event loop keeps answering
    return gate


async def entered(gate: Gate) -> None:
    while not gate.entered.is_set():
        await asyncio.sleep(0.005)


def model_entry(listing: dict, name: str) -> dict:
    return {m["name"]: m for m in listing["models"]}.get(name, {})


def corrupt(bundle_dir) -> None:
    model = served_file(bundle_dir)
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))


async def test_admin_api_is_off_without_its_key_and_needs_its_own(tmp_path, add_version):
    root = tmp_path / "models"
    add_version(root, "sst", "1")
    async with serving(root) as (_, client):
        off = await client.post("/admin/models/sst/load", headers=ADMIN)
        assert off.status_code == 404 and off.json()["error"] == "admin_disabled"
        assert "ADMIN_API_KEY" in off.json()["message"]
    async with serving(root, api_key="user-key", admin_api_key=ADMIN_KEY) as (_, client):
        for headers in ({}, {"Authorization": "Bearer user-key"}, {"Authorization": "Bearer admin-test-kez"}):
            r = await client.post("/admin/models/sst/load", headers=headers)
            assert r.status_code == 401 and r.json()["error"] == "unauthorized", headers
        r = await client.post("/admin/models/sst/load", headers=ADMIN)
        assert r.status_code == 200 and r.json() == {**r.json(), "changed": False}  # already serving
        # The admin key does not open the model endpoints, nor the other way round.
        assert (await client.post("/classify", json={"text": TEXT}, headers=ADMIN)).status_code == 401
        for name, status in (("nothere", 404), ("..", 422), ("a%2Fb", 404)):
            r = await client.post(f"/admin/models/{name}/load", headers=ADMIN)
            assert r.status_code in (status, 404), (name, r.text)
        assert (
            "MODELS_DIR has no model 'nothere'"
            in (await client.post("/admin/models/nothere/load", headers=ADMIN)).json()["message"]
        )
    with pytest.raises(ValidationError, match="ADMIN_API_KEY must differ from API_KEY"):
        Settings(models_dir=root, api_key="same", admin_api_key="same")


async def test_a_new_version_swaps_in_atomically_while_requests_are_in_flight(tmp_path, add_version):
    root = tmp_path / "models"
    add_version(root, "sst", "1", labels=["neg@1", "pos@1"])
    async with serving(root, admin_api_key=ADMIN_KEY) as (app, client):
        gate = hold(bundle_of(app, "classify", "sst"))
        in_flight = asyncio.create_task(client.post("/classify", json={"text": TEXT, "model": "sst"}))
        await entered(gate)

        add_version(root, "sst", "2", labels=["neg@2", "pos@2"])
        loaded = await client.post("/admin/models/sst/load", headers=ADMIN)
        assert loaded.status_code == 200, loaded.text
        body = loaded.json()
        assert body["changed"] is True and body["model"]["version"] == "2"
        assert [(v["version"], v["status"]) for v in body["model"]["versions"]] == [
            ("2", "serving"),
            ("1", "retiring"),  # still answering the request admitted before the swap
        ]
        after = await client.post("/classify", json={"text": TEXT, "model": "sst"})
        assert after.headers["x-model-version"] == "2" and after.json()["label"].endswith("@2")

        gate.release.set()
        before = await in_flight
        assert before.status_code == 200 and before.headers["x-model-version"] == "1"
        assert before.json()["label"].endswith("@1")  # answered wholly by the version it was admitted to
        for _ in range(200):
            sst = model_entry((await client.get("/models")).json(), "sst")
            if sst["versions"][1]["status"] == "retired":
                break
            await asyncio.sleep(0.01)
        assert [(v["version"], v["status"]) for v in sst["versions"]] == [("2", "serving"), ("1", "retired")]
        # Loading again with nothing changed on disk is a no-op.
        assert (await client.post("/admin/models/sst/load", headers=ADMIN)).json()["changed"] is False


@pytest.mark.parametrize("damage", ["corrupted", "wrong_task"])
async def test_a_broken_new_version_is_refused_while_the_old_one_serves(
    tmp_path, add_version, damage, caplog
):
    root = tmp_path / "models"
    add_version(root, "sst", "1", labels=["neg@1", "pos@1"])
    caplog.set_level(logging.ERROR, logger="app")
    async with serving(root, admin_api_key=ADMIN_KEY) as (_, client):
        if damage == "corrupted":
            corrupt(add_version(root, "sst", "2", labels=["neg@2", "pos@2"]))
            phrase = "does not match its sha256"
        else:
            add_version(root, "sst", "2", task="ner")
            phrase = "is a ner model, but 'sst' serves classify"
        refused = await client.post("/admin/models/sst/load", headers=ADMIN)
        assert refused.status_code == 422 and refused.json()["error"] == "version_rejected", refused.text
        assert phrase in refused.json()["message"] and "version 2" in refused.json()["message"]
        r = await client.post("/classify", json={"text": TEXT})
        assert (
            r.status_code == 200 and r.headers["x-model-version"] == "1" and r.json()["label"].endswith("@1")
        )
        sst = model_entry((await client.get("/models")).json(), "sst")
        assert sst["status"] == "ready" and sst["version"] == "1"
        assert [(v["version"], v["status"]) for v in sst["versions"]] == [("2", "rejected"), ("1", "serving")]
        assert phrase in sst["versions"][0]["error"]
        assert (await client.get("/ready")).status_code == 200  # a working version serves
        metrics = (await client.get("/metrics")).text
        assert 'bert_model_loads_total{model="sst",result="rejected"} 1.0' in metrics
    lines = [r for r in caplog.records if r.getMessage() == "bundle failed to load and will not be served"]
    assert (
        len(lines) == 1 and lines[0].version == "2" and lines[0].serving == "1" and phrase in lines[0].error
    )


async def test_unload_waits_for_the_requests_in_flight(tmp_path, add_version):
    root = tmp_path / "models"
    add_version(root, "sst", "1")
    add_version(root, "other", None)
    async with serving(root, admin_api_key=ADMIN_KEY, default_bundles="classify=sst") as (app, client):
        gate = hold(bundle_of(app, "classify", "sst"))
        in_flight = asyncio.create_task(client.post("/classify", json={"text": TEXT}))
        await entered(gate)
        unloading = asyncio.create_task(client.post("/admin/models/sst/unload", headers=ADMIN))
        await asyncio.sleep(0.1)
        assert not unloading.done()  # waiting for the request it is serving
        refused = await client.post("/classify", json={"text": TEXT, "model": "sst"})
        assert refused.status_code == 503 and refused.json()["error"] == "model_unavailable"
        sst = model_entry((await client.get("/models")).json(), "sst")
        assert sst["status"] == "unloading"
        gate.release.set()
        assert (await in_flight).status_code == 200
        unloaded = await unloading
        assert unloaded.status_code == 200 and unloaded.json()["model"]["status"] == "unloaded"
        # It waited for the held request (not done before the release, above); how long depends on
        # when the server got to the unload, so only that it reports a wait.
        assert unloaded.json()["waited_s"] > 0
        gone = await client.post("/classify", json={"text": TEXT, "model": "sst"})
        assert gone.status_code == 404 and "'sst' is unloaded" in gone.json()["message"]
        assert (await client.post("/classify", json={"text": TEXT, "model": "other"})).status_code == 200
        assert (await client.get("/ready")).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'bert_model_ready{model="sst"' not in metrics and 'bert_model_ready{model="other"' in metrics
        again = await client.post("/admin/models/sst/unload", headers=ADMIN)
        assert again.status_code == 404
        reloaded = await client.post("/admin/models/sst/load", headers=ADMIN)
        assert reloaded.status_code == 200 and reloaded.json()["model"]["status"] == "ready"
        assert (await client.post("/classify", json={"text": TEXT})).status_code == 200


async def test_loads_beyond_the_memory_limit_are_refused(tmp_path, add_version, monkeypatch):
    root = tmp_path / "models"
    add_version(root, "sst", "1")
    # Below the weights of the int8 graph: refused before any session opens.
    async with serving(root, ready=False, max_models_memory_mb=0.01) as (_, client):
        assert (await wait_ready(client)).status_code == 503
        sst = model_entry((await client.get("/models")).json(), "sst")
        assert sst["status"] == "failed" and "MAX_MODELS_MEMORY_MB leaves 0.0 MB" in sst["error"]
        assert "hold at least" in sst["error"]

    # Measured after the warm-up: a version that grew the process by more than the room left is dropped.
    from app.engine import loader

    real = loader.resident_bytes
    async with serving(root, admin_api_key=ADMIN_KEY, max_models_memory_mb=64) as (_, client):
        assert model_entry((await client.get("/models")).json(), "sst")["memory_mb"] < 64
        add_version(root, "sst", "2")
        calls = iter(range(10))
        monkeypatch.setattr(loader, "resident_bytes", lambda: real() + (next(calls) * 100 << 20))
        refused = await client.post("/admin/models/sst/load", headers=ADMIN)
        assert refused.status_code == 409 and refused.json()["error"] == "memory_limit", refused.text
        assert re.search(r"took 1\d\d\.\d MB once loaded and warmed up", refused.json()["message"])
        r = await client.post("/classify", json={"text": TEXT})
        assert r.status_code == 200 and r.headers["x-model-version"] == "1"


async def wait_for(client, check, timeout_s: float = 10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        listing = (await client.get("/models")).json()
        if check(listing) or loop.time() > deadline:
            return listing
        await asyncio.sleep(0.02)


async def test_model_poll_s_follows_models_dir(tmp_path, add_version, caplog):
    root = tmp_path / "models"
    add_version(root, "sst", "1", labels=["neg@1", "pos@1"])
    caplog.set_level(logging.ERROR, logger="app")
    async with serving(root, model_poll_s=0.05) as (_, client):
        add_version(root, "sst", "2", labels=["neg@2", "pos@2"])
        await wait_for(client, lambda x: model_entry(x, "sst")["version"] == "2")
        r = await client.post("/classify", json={"text": TEXT})
        assert r.headers["x-model-version"] == "2" and r.json()["label"].endswith("@2")

        corrupt(add_version(root, "sst", "3"))
        listing = await wait_for(
            client, lambda x: model_entry(x, "sst")["versions"][0]["status"] == "rejected"
        )
        assert model_entry(listing, "sst")["version"] == "2"
        await asyncio.sleep(0.3)  # several polls: the same broken files are not retried
        rejected = [r for r in caplog.records if getattr(r, "version", None) == "3"]
        assert len(rejected) == 1
        add_version(root, "extra", None, task="ner")  # a new model appears
        listing = await wait_for(client, lambda x: model_entry(x, "extra").get("status") == "ready")
        assert model_entry(listing, "extra")["status"] == "ready"
        assert (await client.post("/ner", json={"text": TEXT})).headers["x-model"] == "extra"

        served_file(root / "sst" / "3").write_bytes(served_file(root / "sst" / "2").read_bytes())
        await wait_for(client, lambda x: model_entry(x, "sst")["version"] == "3")  # fixed: picked up
        shutil.rmtree(root / "extra")  # removed from MODELS_DIR: unloaded
        listing = await wait_for(client, lambda x: model_entry(x, "extra")["status"] == "unloaded")
        assert model_entry(listing, "extra")["status"] == "unloaded"
        assert (await client.post("/ner", json={"text": TEXT})).status_code == 404
