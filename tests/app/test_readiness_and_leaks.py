"""Readiness per model, and what answers and logs may show (issue 42, findings 7 and 12)."""

from __future__ import annotations

import json
import logging
import shutil

from tests.app.conftest import serving, wait_ready

ADMIN_KEY, API_KEY = "admin-key-42", "user-key-42"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
USER = {"Authorization": f"Bearer {API_KEY}"}


def broken_copy(source, target) -> None:
    shutil.copytree(source, target)
    (target / "bundle.json").write_text("{not json")


async def test_a_model_added_later_that_fails_leaves_the_server_ready(make_models_dir, app_bundles):
    models = make_models_dir(("classify", "ner"))
    async with serving(models, api_key=API_KEY, admin_api_key=ADMIN_KEY) as (_, client):
        broken_copy(app_bundles["qa"], models / "late-qa")
        r = await client.post("/admin/models/late-qa/load", headers=ADMIN)
        assert r.status_code == 422
        ready = await client.get("/ready")
        assert ready.status_code == 200 and ready.json()["models"]["late-qa"] == "failed"
        # Through the poller's code as well: a half-copied directory.
        (models / "half-copied").mkdir()
        (models / "half-copied" / "bundle.json").write_text('{"task": "qa"')
        await client.post("/admin/poll", headers=ADMIN)
        ready = await client.get("/ready")
        assert ready.status_code == 200 and ready.json()["models"]["half-copied"] == "failed"
        assert (await client.post("/classify", json={"text": "good"}, headers=USER)).status_code == 200
        v2 = await client.get("/v2/health/ready")
        assert v2.status_code == 200


async def test_at_start_up_a_model_whose_only_version_fails_keeps_the_server_unready(make_models_dir):
    """The start-up rule: a replica becomes ready only when every model it found serves."""
    models = make_models_dir(("classify", "ner"))
    (models / "ner" / "bundle.json").write_text("{not json")
    async with serving(models, ready=False) as (_, client):
        r = await wait_ready(client)
        assert (
            r.status_code == 503 and r.json()["status"] == "failed" and r.json()["models"]["ner"] == "failed"
        )


async def test_unauthenticated_ready_says_ready_or_not_and_no_answer_shows_a_path(
    make_models_dir, app_bundles
):
    models = make_models_dir(("classify",))
    (models / "classify" / "bundle.json").write_text("{not json")  # its error names the file's path
    root = str(models.resolve())
    async with serving(models, ready=False, api_key=API_KEY, admin_api_key=ADMIN_KEY) as (_, client):
        client.headers.update(USER)
        await wait_ready(client)
        del client.headers["authorization"]
        r = await client.get("/ready")
        assert r.status_code == 503 and r.json()["errors"] == {}  # no reason, no internals, no path
        assert r.json()["models"] == {"classify": "failed"}
        keyed = await client.get("/ready", headers=USER)
        assert "not valid JSON" in keyed.json()["errors"]["classify"] and root not in keyed.text
        listing = await client.get("/models", headers=USER)
        assert listing.status_code == 200 and root not in listing.text and "/tmp" not in listing.text
        shutil.copytree(app_bundles["ner"], models / "ner")
        loaded = await client.post("/admin/models/ner/load", headers=ADMIN)
        assert loaded.status_code == 200 and root not in loaded.text
        assert loaded.json()["model"]["path"] == "ner"
        broken_copy(app_bundles["qa"], models / "qa")
        refused = await client.post("/admin/models/qa/load", headers=ADMIN)
        assert refused.status_code == 422 and root not in refused.text and "MODELS_DIR" in refused.text
        health = await client.get("/health")
        assert health.json() == {"status": "ok"}


async def test_access_log_fields_are_capped(models_dir, caplog):
    caplog.set_level(logging.INFO, logger="app.access")
    async with serving(models_dir) as (_, client):
        await client.get("/" + "x" * 20_000)
    lines = [r for r in caplog.records if r.getMessage() == "request"]
    assert lines and all(len(json.dumps(r.path)) < 400 for r in lines)
