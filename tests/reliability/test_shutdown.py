"""A real `uvicorn app.main:app` process on MODELS_DIR, end to end: request ids, Server-Timing and
JSON logs; and graceful shutdown: on SIGTERM readiness turns false, in-flight requests finish with
their answers, and only then does the process exit."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx

from benchmarks.rawhttp import ConnectionPool, post_json
from tests.reliability.live import start_server

HOLD_MS = 1500  # MAX_WAIT_MS: a lone small batch waits this long for company, so requests stay in flight
IN_FLIGHT = 6


def queue_depth(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith('bert_queue_depth{model="classify",task="classify"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def probe_ready(url: str) -> int | str:
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code
    except httpx.TransportError as error:
        return type(error).__name__  # the listener is closed: not ready either


async def test_sigterm_stops_readiness_finishes_in_flight_requests_then_exits(models_dir, tmp_path):
    server = start_server(models_dir, tmp_path, LOG_LEVEL="INFO", MAX_WAIT_MS=str(HOLD_MS))
    try:
        assert server.wait_ready().status_code == 200
        pool = ConnectionPool("127.0.0.1", server.port)
        requests = [
            asyncio.create_task(
                pool.request(
                    post_json("/classify", {"text": f"a good film {i}"}, {"x-request-id": f"held-{i}"})
                )
            )
            for i in range(IN_FLIGHT)
        ]
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(queue_depth, server.url) < IN_FLIGHT:  # all held in the batcher
            assert time.monotonic() < deadline and not any(r.done() for r in requests)
            await asyncio.sleep(0.01)

        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        probes = []
        while time.monotonic() - signalled < 1.0 and server.process.poll() is None:
            probes.append(await asyncio.to_thread(probe_ready, server.url))
        responses = await asyncio.wait_for(asyncio.gather(*requests), 20)
        answered = time.monotonic()
        code = await asyncio.to_thread(server.process.wait, 20)
        exited = time.monotonic()
    finally:
        server.stop()

    print(f"/ready after SIGTERM: {probes}")
    # Readiness never said yes again: 503 shutting_down while the listener was open, then no answer.
    assert probes and all(p == 503 for p in probes if isinstance(p, int)), probes
    # The in-flight requests were answered after the signal, then the process exited cleanly.
    assert [r.status for r in responses] == [200] * IN_FLIGHT
    assert all(r.json()["label"] in ("negative", "positive") for r in responses)
    # Each answer echoes its request id and says how long inference took.
    assert [r.headers["x-request-id"] for r in responses] == [f"held-{i}" for i in range(IN_FLIGHT)]
    assert all("inference;dur=" in r.headers["server-timing"] for r in responses)
    assert answered - signalled > 0.2 and exited >= answered
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a graceful shutdown
    for line in server.log_text().splitlines():  # uvicorn's own lines too: one JSON record each
        assert line.startswith("{") or not line.strip(), f"non-JSON log line: {line!r}"
    records = server.log_records()
    messages = [r["message"] for r in records]
    assert "bundle ready" in messages
    served = [i for i, r in enumerate(records) if r["message"] == "request" and r.get("path") == "/classify"]
    assert len(served) == IN_FLIGHT and all(records[i]["status"] == 200 for i in served)
    assert sorted(records[i].get("request_id") for i in served) == [f"held-{i}" for i in range(IN_FLIGHT)]
    assert max(served) < messages.index("shutdown complete")
    assert "Traceback" not in server.log_text()
