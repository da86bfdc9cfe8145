"""Faults: damaged model files, a batch that raises, and clients that stall or vanish mid-request."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import httpx

from tests.app.conftest import bundle_of, serving
from tests.reliability.conftest import AUTH, LIVE_MAX_IN_FLIGHT
from tests.reliability.live import start_server

FAILED_LINE = "bundle failed to load and will not be served"


def damage(bundle_dir, how: str) -> str:
    """Break the bundle's int8 model (the variant served on CPU); returns a phrase the error must contain."""
    model = bundle_dir / "model_int8_rowwise.onnx"
    if how == "missing":
        model.unlink()
        return "is missing"
    if how == "truncated":
        model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
        return "truncated"
    data = bytearray(model.read_bytes())  # tampered: same size, one byte flipped
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    return "sha256"


def test_damaged_model_files_fail_readiness_with_a_clear_log_line(make_models_dir, tmp_path):
    models = make_models_dir()
    damaged = {"classify": "missing", "ner": "truncated", "qa": "tampered"}
    phrases = {task: damage(models / task, how) for task, how in damaged.items()}
    server = start_server(models, tmp_path / "logs")
    try:
        server.wait_ready()
        deadline = time.monotonic() + 60
        while True:  # until every bundle has finished loading, one way or the other
            info = httpx.get(f"{server.url}/models", timeout=5).json()["models"]
            if all(m["status"] in ("ready", "failed") for m in info) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        ready = httpx.get(f"{server.url}/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["status"] == "failed", ready.text
        for task, phrase in phrases.items():
            assert (
                phrase in ready.json()["errors"][task]
                and "model_int8_rowwise.onnx" in ready.json()["errors"][task]
            )
        unavailable = httpx.post(f"{server.url}/classify", json={"text": "good"}, timeout=5)
        assert unavailable.status_code == 503 and unavailable.json()["error"] == "model_unavailable"
        intact = {"context": "the cat sat", "choices": ["on the mat", "in the river"]}
        assert httpx.post(f"{server.url}/multiple-choice", json=intact, timeout=5).status_code == 200
    finally:
        server.stop()
    lines = [r for r in server.log_records() if r["message"] == FAILED_LINE]
    assert sorted(r["bundle"] for r in lines) == sorted(damaged), server.log_text()
    for record in lines:
        assert record["level"] == "ERROR" and phrases[record["bundle"]] in record["error"]
        assert "model_int8_rowwise.onnx" in record["error"] and record["path"].endswith(record["bundle"])
    assert "Traceback" not in server.log_text()


async def test_a_failing_batch_fails_only_its_requests_and_the_worker_goes_on(models_dir):
    async with serving(models_dir, max_batch_size=4, max_wait_ms=30) as (app, client):
        bundle = bundle_of(app, "classify")
        poison = bundle.tokenizer.encode("terrible").input_ids[1]
        inner, batches = bundle.batcher.runtime, []

        class Poisoned:
            """Raises, with internal details in the message, for any batch holding the poison token."""

            def run(self, inputs):
                pairs = zip(inputs["input_ids"], inputs["attention_mask"], strict=True)
                rows = [tuple(ids[mask == 1]) for ids, mask in pairs]
                failed = any(poison in row for row in rows)
                batches.append((rows, failed))
                if failed:
                    raise RuntimeError("injected failure in /srv/secret/model_int8.onnx")
                return inner.run(inputs)

        bundle.batcher.runtime = Poisoned()
        texts = [f"{'terrible' if i in (5, 17) else 'good'} film {i}" for i in range(24)]
        responses = await asyncio.gather(*(client.post("/classify", json={"text": t}) for t in texts))

        row_of = {t: tuple(bundle.tokenizer.encode(t, max_length=64).input_ids) for t in texts}
        failed_rows = {row for rows, failed in batches if failed for row in rows}
        assert any(failed for _, failed in batches) and any(not failed for _, failed in batches)
        for text, response in zip(texts, responses, strict=True):
            if row_of[text] in failed_rows:  # its batch raised: a JSON error without internals
                assert response.status_code == 500, (text, response.text)
                assert response.json()["error"] == "inference_failed" and response.json()["request_id"]
                assert "secret" not in response.text and "Traceback" not in response.text
            else:
                assert response.status_code == 200 and response.json()["label"], (text, response.text)
        assert any(r.status_code == 200 for r in responses)  # clean batches were served meanwhile

        # The worker survived: the same batcher serves the next requests.
        assert bundle.batcher.running
        bundle.batcher.runtime = inner
        again = await client.post("/classify", json={"text": "terrible film"})
        assert again.status_code == 200


def stalled_request(port: int, path: str, partial: str) -> socket.socket:
    """Open a connection and send part of a request, then nothing more."""
    sock = socket.create_connection(("127.0.0.1", port))
    body = b'{"text": "' + b"a " * 500 + b'"}'
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if partial == "headers":
        sock.sendall(head.encode())  # the blank line ending the headers never comes
    else:
        sock.sendall(head.encode() + b"\r\n" + body[: len(body) // 2])
    return sock


def test_stalled_and_vanishing_clients_do_not_stall_the_service(live):
    port = live.port
    stalled = [stalled_request(port, "/classify", "body") for _ in range(LIVE_MAX_IN_FLIGHT + 8)]
    stalled += [stalled_request(port, path, "headers") for path in ("/ner", "/qa") for _ in range(4)]
    try:
        # Clients that send a whole request (many QA windows of work) and hang up at once, half of
        # them with a reset: their queued work must simply be dropped.
        heavy = b'{"question": "who?", "context": "' + b"john smith lives in paris. " * 300 + b'"}'
        for i in range(10):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                head = (
                    f"POST /qa HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH['Authorization']}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(heavy)}\r\n\r\n"
                )
                sock.sendall(head.encode() + heavy)
                if i % 2:  # SO_LINGER with a zero timeout: close() sends RST, not FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        # Meanwhile everyone else, on the same endpoints, is served promptly.
        with httpx.Client(base_url=live.url, headers=AUTH, timeout=10) as client:
            for i in range(12):
                started = time.perf_counter()
                response = client.post("/classify", json={"text": f"a good film {i}"})
                assert response.status_code == 200 and time.perf_counter() - started < 2.0
                started = time.perf_counter()
                response = client.post(
                    "/qa", json={"question": "who?", "context": "john smith lives in paris"}
                )
                assert response.status_code == 200 and time.perf_counter() - started < 2.0
    finally:
        for sock in stalled:
            sock.close()
    # Once the stalled clients are gone, nothing is left counted as in flight but this scrape.
    deadline = time.monotonic() + 10
    while True:
        metrics = httpx.get(f"{live.url}/metrics", timeout=5).text
        if "bert_in_flight_requests 1.0" in metrics or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert "bert_in_flight_requests 1.0" in metrics
    assert "Traceback" not in live.log_text()
