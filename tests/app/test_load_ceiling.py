"""Issue 42: a version whose loading and warm-up outlast MAX_LOAD_S is refused, and the other
models keep serving."""

from __future__ import annotations

import asyncio

import pytest

from tests.app.conftest import serving


async def settled(client) -> list[dict]:
    """/models once no model is still pending or loading."""
    for _ in range(300):
        models = (await client.get("/models")).json()["models"]
        if all(m["status"] not in ("pending", "loading") for m in models):
            return models
        await asyncio.sleep(0.1)
    raise AssertionError(f"models still loading: {models}")


@pytest.mark.asyncio
async def test_a_version_slower_to_warm_up_than_max_load_s_is_refused(models_dir):
    # Simulated batches of 400 ms: every warm-up (two batches at least) outlasts a 0.3 s ceiling.
    async with serving(
        models_dir, ready=False, device="simulated", simulated_batch_ms=400.0, max_load_s=0.3
    ) as (_, client):
        models = await settled(client)
        assert models and all(m["status"] == "failed" for m in models), models
        assert all("MAX_LOAD_S" in (m.get("error") or "") for m in models), models
    async with serving(models_dir, device="simulated", simulated_batch_ms=400.0, max_load_s=0) as (_, client):
        assert all(m["status"] == "ready" for m in await settled(client))
