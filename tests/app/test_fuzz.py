"""Schema-driven fuzzing of a live server: no input, valid or not, may produce a 5xx."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

ROOT = Path(__file__).resolve().parents[2]


# schemathesis' own pytest plugin does not run under pytest 9, so hypothesis drives its strategies.
@pytest.fixture(scope="module")
def live_server(models_dir, tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path_factory.mktemp("fuzz") / "server.log").open("w")
    env = {**os.environ, "MODELS_DIR": str(models_dir), "LOG_LEVEL": "WARNING", "MAX_WAIT_MS": "0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield base
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_no_input_causes_a_server_error(live_server):
    schema = schemathesis.openapi.from_url(f"{live_server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/classify", "/ner", "/multiple-choice", "/qa"}
    statuses: Counter[int] = Counter()
    for operation in operations:
        # Operations without a body or parameters have no invalid form to generate.
        modes = [GenerationMode.POSITIVE] + (
            [GenerationMode.NEGATIVE] if operation.method.upper() == "POST" else []
        )
        for mode in modes:
            check_operation(operation, mode, statuses)
    # Both valid requests (served) and invalid ones (4xx) were exercised.
    assert statuses[200] > 20 and statuses[422] > 20, statuses


def check_operation(operation, mode: GenerationMode, statuses: Counter[int]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:
        response = case.call()
        statuses[response.status_code] += 1
        assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
        if response.status_code >= 400:
            body = response.json()
            assert body["error"] and body["message"]

    run()
