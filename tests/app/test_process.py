"""The service as a process imports no torch. (`uvicorn app.main:app` end to end, request ids, JSON
logs and SIGTERM: tests/reliability/test_shutdown.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
