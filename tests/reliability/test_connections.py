"""Hostile connections against a live server, on real sockets (issue 42, findings 1-4 and the
`server` header of 12): idle and slow connections are timed out, headers and bodies bounded, the
open connections capped without locking out probes, and the key checked before the body."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.v2 import bytes_request, zero_length_elements
from tests.reliability.conftest import API_KEY, AUTH
from tests.reliability.live import LiveServer, start_server

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
MAX_HEADER_BYTES = 8192
PENDING_MB = 2
NOFILE = 256  # `ulimit -n`: the connection cap defaults to 128 below it
ORIGIN = "https://app.example"
REFUSAL_DELAY_S = 0.5


@pytest.fixture(scope="module")
def guarded(models_dir, tmp_path_factory) -> Iterator[LiveServer]:
    server = start_server(
        models_dir,
        tmp_path_factory.mktemp("connections"),
        nofile=NOFILE,
        API_KEY=API_KEY,
        HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        MAX_HEADER_BYTES=str(MAX_HEADER_BYTES),
        MAX_PENDING_BODY_MB=str(PENDING_MB),
        CORS_ORIGINS=ORIGIN,
        REFUSAL_DELAY_MS=str(REFUSAL_DELAY_S * 1000),
    )
    try:
        assert server.wait_ready().status_code == 200, server.log_text()
        yield server
    finally:
        server.stop()


def connect(server: LiveServer, timeout_s: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s)
    return sock


def read_answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (or the socket's timeout)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def timed(sock: socket.socket) -> tuple[int, float]:
    started = time.monotonic()
    return status_of(read_answer(sock)), time.monotonic() - started


def test_a_connection_that_sends_nothing_is_timed_out(guarded):
    status, waited = timed(connect(guarded))
    assert status == 408 and waited < HEADER_TIMEOUT_S + 2


def test_a_partial_request_line_is_timed_out(guarded):
    sock = connect(guarded)
    sock.sendall(b"GET /hea")
    status, waited = timed(sock)
    assert status == 408 and waited < HEADER_TIMEOUT_S + 2


def test_slowloris_headers_are_timed_out(guarded):
    sock = connect(guarded)
    started = time.monotonic()
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 100
    sent = 0
    try:
        for byte in request:  # one byte every 50 ms: each arrives long before any idle timeout
            sock.sendall(bytes([byte]))
            sent += 1
            time.sleep(0.05)
    except (BrokenPipeError, ConnectionResetError):
        pass
    status = status_of(read_answer(sock))
    assert status == 408 and time.monotonic() - started < HEADER_TIMEOUT_S + 2 and sent < len(request)


def test_headers_beyond_the_limit_get_431_and_are_never_buffered(guarded):
    before = guarded.rss_mb()
    for _ in range(4):  # as the four connections of endless header lines
        sock = connect(guarded)
        sent = 0
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            while sent < 64 << 20:
                sock.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
                sent += 1012
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_answer(sock)
        assert sent < 16 << 20, "the server kept reading headers"
        assert status_of(answer) in (431, 0)  # 0: the reset overtook the answer
    sock = connect(guarded)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES + 10) + b"\r\n\r\n")
    assert status_of(read_answer(sock)) == 431
    assert guarded.rss_mb() - before < 50


def post_head(path: str, length: int, *, key: bool = True) -> bytes:
    auth = f"Authorization: Bearer {API_KEY}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def test_a_stalled_body_gets_408(guarded):
    sock = connect(guarded)
    sock.sendall(post_head("/classify", 100_000) + b'{"text": "' + b"a" * 1000)
    status, waited = timed(sock)
    assert status == 408 and waited < BODY_TIMEOUT_S + 2


def test_bodies_still_arriving_hold_bounded_memory(guarded):
    """Bodies of 1 MiB each, sent all but the last bytes, then stalled: past MAX_PENDING_BODY_MB
    the next one is refused with 503 at once, and memory comes back when they time out."""
    before = guarded.rss_mb()
    socks, statuses = [], []
    for _ in range(PENDING_MB + 3):
        sock = connect(guarded, timeout_s=0.5)
        sock.sendall(post_head("/classify", 1 << 20))
        try:
            sock.sendall(b"a" * ((1 << 20) - 10))
        except (BrokenPipeError, ConnectionResetError):
            pass
        socks.append(sock)
    for sock in socks:
        answer = read_answer(sock)
        statuses.append(status_of(answer))
    assert 503 in statuses, statuses
    assert set(statuses) <= {503, 408, 0}, statuses
    assert httpx.post(f"{guarded.url}/classify", json={"text": "good"}, headers=AUTH).status_code == 200
    assert guarded.rss_mb() - before < 50


def test_past_the_connection_cap_probes_still_get_in(guarded):
    """More idle connections than the file limit allows: each new one closes the oldest idle one,
    so /health and a keyed client still get answers (before: connection reset for everyone)."""
    idle = []
    for _ in range(NOFILE + 20):
        try:
            idle.append(connect(guarded, timeout_s=2))
        except OSError:
            break
    try:
        health = httpx.get(f"{guarded.url}/health", timeout=5)
        assert health.status_code == 200
        keyed = httpx.post(f"{guarded.url}/classify", json={"text": "good"}, headers=AUTH, timeout=10)
        assert keyed.status_code == 200
    finally:
        for sock in idle:
            sock.close()


def one_response(sock: socket.socket) -> bytes:
    """One whole response on a kept-alive connection (its head, then Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_a_served_client_keeps_its_connection_when_idle_ones_are_closed(guarded):
    keep = connect(guarded)
    keyed = f"GET /models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode()
    keep.sendall(keyed)
    assert one_response(keep).startswith(b"HTTP/1.1 200")
    idle = []
    try:
        # Past the cap (NOFILE - 128), quickly: within uvicorn's 5 s keep-alive timeout.
        for _ in range(NOFILE - 128 + 20):  # each new one closes an idle one never answered
            idle.append(connect(guarded, timeout_s=2))
        keep.sendall(keyed)
        assert one_response(keep).startswith(b"HTTP/1.1 200")
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize(
    "path",
    ["/classify", "/ner", "/qa", "/embed", "/v1/embeddings", "/tokenize", "/v2/models/tiny-classify/infer"],
)
def test_the_key_is_checked_before_any_body_byte(guarded, path):
    sock = connect(guarded, timeout_s=5)
    sock.sendall(post_head(path, 900_000, key=False))  # the body never comes
    status, waited = timed(sock)
    assert status == 401 and waited < REFUSAL_DELAY_S + 1


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b'{"text": ' + b"[" * 10_000])
def test_401_whatever_the_body(guarded, body):
    r = httpx.post(f"{guarded.url}/classify", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    r = httpx.get(f"{guarded.url}/models")
    assert r.status_code == 401


def counted(server: LiveServer, line: str) -> float:
    """The value of one /metrics sample (0 when absent)."""
    for sample in httpx.get(f"{server.url}/metrics").text.splitlines():
        if sample.startswith(line + " "):
            return float(sample.split()[-1])
    return 0.0


def test_a_keyless_request_is_refused_below_the_app(guarded):
    """The connection layer answers it: no ASGI request, so the app never counts it."""
    below = 'bert_connections_refused_total{reason="unauthorized"}'
    app_401 = 'bert_requests_total{endpoint="/classify",model="",status="401"}'
    before = counted(guarded, below), counted(guarded, app_401)
    for _ in range(3):
        r = httpx.post(f"{guarded.url}/classify", json={"text": "x"}, headers={"Authorization": "Bearer no"})
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer" and "API key" in r.json()["message"]
    assert (counted(guarded, below), counted(guarded, app_401)) == (before[0] + 3, before[1])


def test_the_refusal_below_the_app_follows_the_key_rule(guarded):
    r = httpx.post(f"{guarded.url}/v2/models/classify/infer", json={"inputs": []})
    assert r.status_code == 401 and set(r.json()) == {"error"}  # KServe's error body on V2 paths
    assert httpx.get(f"{guarded.url}/heal%74h").status_code == 200  # the decoded path is open
    assert httpx.get(f"{guarded.url}/v2/models/classify/ready").status_code == 200
    assert httpx.get(f"{guarded.url}/models", headers=AUTH).status_code == 200


def test_cors_requests_get_their_401_from_the_app(guarded):
    """A browser can read a 401 only with the CORS headers, which the app's middleware adds."""
    r = httpx.post(f"{guarded.url}/classify", json={"text": "x"}, headers={"Origin": ORIGIN})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    r = httpx.options(f"{guarded.url}/classify", headers=preflight)  # never carries the key
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def v2_binary(shape: list[int], data: bytes) -> tuple[bytes, bytes]:
    """A keyed V2 binary request's head and body (its JSON header, then `data`)."""
    body, header = bytes_request(shape, data)
    head = post_head("/v2/models/classify/infer", len(body)).replace(
        b"application/json",
        b"application/octet-stream\r\nInference-Header-Content-Length: " + str(header).encode(),
    )
    return head, body


def test_a_v2_header_over_the_limits_is_refused_before_its_data(guarded):
    below = 'bert_connections_refused_total{reason="v2_shapes"}'
    before = counted(guarded, below)
    head, body = v2_binary([200_000], zero_length_elements(200_000))
    sock = connect(guarded, timeout_s=5)
    sock.sendall(head + body[: body.index(b"}]}") + 3])  # the JSON header only: the data never comes
    answer = read_answer(sock)
    assert status_of(answer) == 400 and b"200000" in answer
    assert json.loads(answer.partition(b"\r\n\r\n")[2]).keys() == {"error"}
    assert counted(guarded, below) == before + 1
    # Within the limits, the same framing is served: the app starts once the header is in.
    text = b"a fine film"
    head, body = v2_binary([1], struct.pack("<I", len(text)) + text)
    sock = connect(guarded, timeout_s=10)
    sock.sendall(head + body[:20])
    time.sleep(0.2)  # the header arrives in pieces
    sock.sendall(body[20:])
    assert one_response(sock).startswith(b"HTTP/1.1 200")


def test_a_refusal_is_answered_after_the_delay_and_probes_go_first(guarded):
    """A client refused one request at a time waits REFUSAL_DELAY_MS for each answer, and its
    paused connections are the first closed at the cap: a probe gets in past a wall of them."""
    sock = connect(guarded)
    sock.sendall(post_head("/classify", 900_000, key=False) + b"x" * 100_000)
    status, waited = timed(sock)
    assert status == 401 and waited >= REFUSAL_DELAY_S * 0.9
    refused = [connect(guarded) for _ in range(NOFILE)]  # past the cap (128)
    for s in refused:
        s.sendall(post_head("/classify", 10, key=False))
    try:
        assert httpx.get(f"{guarded.url}/health", timeout=5).status_code == 200
        answers = [status_of(read_answer(s)) for s in refused]
        assert 401 in answers and 0 in answers, answers  # some answered, the oldest closed for others
        assert set(answers) <= {401, 503, 0}
    finally:
        for s in refused:
            s.close()


def test_no_server_header(guarded):
    assert "server" not in httpx.get(f"{guarded.url}/health").headers
