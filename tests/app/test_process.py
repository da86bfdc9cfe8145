"""The service as a process: no torch anywhere, and `uvicorn app.main:app` end to end."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.reliability.live import start_server

ROOT = Path(__file__).resolve().parents[2]

SERVE_AND_CHECK = """
import asyncio, sys
import httpx
from app.main import create_app
from app.settings import Settings

async def main():
    app = create_app(Settings(models_dir=sys.argv[1], log_level="WARNING"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            while (await client.get("/ready")).status_code != 200:
                await asyncio.sleep(0.02)
            calls = [
                ("/classify", {"text": "good"}),
                ("/ner", {"text": "john smith"}),
                ("/multiple-choice", {"context": "c", "choices": ["a", "b"]}),
                ("/qa", {"question": "who?", "context": "john smith"}),
            ]
            for path, body in calls:
                assert (await client.post(path, json=body)).status_code == 200, path

asyncio.run(main())
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
print("HEAVY:" + ",".join(loaded))
"""


def test_serving_never_imports_torch(models_dir):
    result = subprocess.run(
        [sys.executable, "-c", SERVE_AND_CHECK, str(models_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "HEAVY:\n" in result.stdout or result.stdout.strip().endswith("HEAVY:"), result.stdout


def test_uvicorn_serves_models_dir_and_stops_on_sigterm(models_dir, tmp_path):
    server = start_server(models_dir, tmp_path, LOG_LEVEL="INFO", MAX_WAIT_MS="1")
    try:
        server.wait_ready()
        r = httpx.post(
            f"{server.url}/classify", json={"text": "good"}, headers={"x-request-id": "proc-1"}, timeout=10
        )
        assert r.status_code == 200 and r.headers["x-request-id"] == "proc-1"
        assert "inference;dur=" in r.headers["server-timing"]
        # uvicorn re-raises the signal after a graceful shutdown, so "killed by SIGTERM" is normal.
        assert server.stop() in (0, -signal.SIGTERM)
    finally:
        server.stop()
    for line in server.log_text().splitlines():
        assert line.startswith("{") or not line.strip(), f"non-JSON log line: {line!r}"
    records = server.log_records()
    messages = [r["message"] for r in records]
    assert "bundle ready" in messages and "shutdown complete" in messages
    assert any(r.get("request_id") == "proc-1" and r["message"] == "request" for r in records)
