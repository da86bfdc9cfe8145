"""One shared live server (a real uvicorn process with an API key) for the reliability tests.

The tiny bundles come from tests/conftest.py; tests that need other settings start their own server.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.reliability.live import LiveServer, start_server

API_KEY = f"reliability-{secrets.token_hex(8)}"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LIVE_MAX_IN_FLIGHT = 32  # small, so the slow-client test can open more stalled requests than this


@pytest.fixture(scope="session")
def live(models_dir, tmp_path_factory) -> Iterator[LiveServer]:
    server = start_server(
        models_dir,
        tmp_path_factory.mktemp("live"),
        API_KEY=API_KEY,
        MAX_WAIT_MS="2",
        MAX_IN_FLIGHT=str(LIVE_MAX_IN_FLIGHT),
        REFUSAL_DELAY_MS="10",  # ~80 refused requests in test_security; test_connections times it
    )
    try:
        assert server.wait_ready().status_code == 200, server.log_text()
        yield server
    finally:
        server.stop()
