"""The in-process app client. The tiny bundles (app_bundles, models_dir, ...) are session fixtures in
tests/conftest.py, shared with tests/deploy and tests/reliability."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.conftest import MAX_SEQ_LEN, TASKS  # noqa: F401 - re-exported for the app tests


async def still_loading(client: httpx.AsyncClient) -> bool:
    """A failed bundle makes /ready fail at once; the others may still be loading."""
    models = (await client.get("/models")).json()["models"]
    return any(m["status"] in ("loading", "pending") for m in models)


async def wait_ready(client: httpx.AsyncClient, timeout_s: float = 30.0) -> httpx.Response:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        response = await client.get("/ready")
        settled = response.json().get("status") == "failed" and not await still_loading(client)
        if response.status_code == 200 or settled or loop.time() > deadline:
            return response
        await asyncio.sleep(0.02)


@asynccontextmanager
async def serving(
    models_dir: Path, *, ready: bool = True, **overrides: Any
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """Run the real app in-process (lifespan included) and yield (app, client)."""
    from app.main import create_app
    from app.settings import Settings

    # No refusal delay unless a test asks (test_precount times it): refusals are answered at once.
    settings = Settings(
        **{"models_dir": models_dir, "log_level": "WARNING", "refusal_delay_ms": 0, **overrides}
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            if ready:
                response = await wait_ready(client)
                assert response.status_code == 200, response.text
            yield app, client


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def served(models_dir) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """One app on the shared tiny bundles at the default settings, for the tests that only ask it
    (a test that counts metrics, changes settings or installs weights starts its own with serving)."""
    async with serving(models_dir) as pair:
        yield pair


def bundle_of(app: Any, task: str, model: str | None = None) -> Any:
    """The version serving `model` (default: the task's default model)."""
    return app.state.service_state.registry.serving(task, model)


def relabel(bundle_dir: Path, labels: list[str]) -> None:
    """Rename a bundle's labels (bundle.json lists no hash of itself): answers then show which copy
    of the same weights served them."""
    from export.bundle import load_bundle_manifest, write_manifest

    manifest = load_bundle_manifest(bundle_dir)
    manifest.labels = labels
    write_manifest(bundle_dir, manifest)


@pytest.fixture
def add_version(app_bundles):
    """Copy a tiny bundle into MODELS_DIR as `model` (flat) or `model/<version>` (versioned)."""
    import shutil

    def add(root: Path, model: str, version: str | None = None, task: str = "classify", labels=None) -> Path:
        target = root / model / version if version else root / model
        shutil.copytree(app_bundles[task], target)
        if labels:
            relabel(target, labels)
        return target

    return add


def served_file(bundle_dir: Path) -> Path:
    """The ONNX file the service loads from this bundle on a CPU (CPU_VARIANT's default)."""
    from app.engine.runtime import choose_variant
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle_dir)
    return manifest.variant_path(bundle_dir, choose_variant("cpu", manifest.variants))
