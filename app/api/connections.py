"""Limits at the connection, below ASGI: what a proxy in front would otherwise enforce.

The image runs uvicorn with nothing in front, and uvicorn bounds none of these: a connection that
sends nothing, or its headers or body a byte at a time, is held for ever, and headers of any size
are buffered. `GuardedHttp` is uvicorn's httptools protocol with:

- HEADER_TIMEOUT_S: the request line and headers must arrive within it, from the connection's start
  or the request's first byte (408, then close);
- MAX_HEADER_BYTES: the request line and headers, counted before the parser buffers them (431);
- BODY_TIMEOUT_S: the whole body must arrive within it after the headers (408, or a close once the
  answer has started);
- MAX_PENDING_BODY_MB: bytes of bodies still arriving, all connections together; the chunk (or the
  Content-Length) that would pass it gets 503;
- MAX_CONNECTIONS: at the cap, a new connection closes the oldest connection waiting for a delayed
  refusal, else the oldest that has never been answered and is only sending headers (or nothing),
  else the oldest one idling between requests,
  so a probe or a real client always gets in and a served client keeps its connection; when every
  connection is busy with a request, the new one gets 503 and is closed;
- API_KEY / ADMIN_API_KEY: a request whose headers lack the key its path needs gets its 401 here
  (app/api/auth.py's rule) and its body is never read: a flood of them costs no ASGI request, no
  middleware and no access-log line. Left to AuthMiddleware: CORS requests (their 401 carries the CORS
  headers), preflights, and a request pipelined behind an answer still being written;
- V2 binary: the app starts once the JSON header has arrived, and a header whose shapes are over
  the limits (app/api/precount.py) gets its 400 here, the binary data never read;
- REFUSAL_DELAY_MS: those 401s and 400s, and a 503 for MAX_PENDING_BODY_MB known from the headers,
  are written after this delay, the connection paused meanwhile. A refusal costs 0.2-0.3 ms of CPU
  however early it is made (mostly uvloop's and uvicorn's per-connection work), so only its rate can
  be cut: a client that waits for each answer is refused once per delay per connection.
Idle keep-alive is uvicorn's own `--timeout-keep-alive`. Refusals are written on the socket
before any ASGI request exists, with the statuses of app/api/error_table.py, and counted in
`bert_connections_refused_total{reason}`.

    uvicorn app.main:app --http app.api.connections:GuardedHttp --no-server-header
"""

from __future__ import annotations

import asyncio
import logging
import resource
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.auth import KeyRule
from app.api.error_table import is_v2_path, raw_error, status_of
from app.api.precount import PRECOUNT_BYTES, precount, v2_header_length
from app.errors import HeadersTooLarge, RequestTimeout, ServerBusy, ServiceError, Unauthorized

log = logging.getLogger("app.connections")
MB = 1 << 20
HEADERS_END = b"\r\n\r\n"
# How every launcher runs the service (Makefile, deploy/entrypoint.sh, the tests and benchmarks).
UVICORN_ARGS = ("--http", "app.api.connections:GuardedHttp", "--no-server-header")
REFUSED_SCOPE_KEY = "bert.refused"  # the status this layer answered a request the app had begun


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    max_header_bytes: int
    body_timeout_s: float
    max_pending_body_bytes: int
    max_connections: int
    max_items: int  # MAX_BATCH_ITEMS and MAX_CHOICES: a V2 binary header's shapes (precount)
    max_choices: int
    refusal_delay_s: float


def auto_max_connections() -> int:
    """Below the open-file limit, so that accept() never fails for lack of descriptors (which would
    refuse everyone), with room for the models' files, logs and sockets of the process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(4096, soft - 128)) if soft != resource.RLIM_INFINITY else 4096


def connection_budget(max_connections: int, grpc_port: int | None) -> tuple[int, int]:
    """(HTTP, gRPC) connections of this process: MAX_CONNECTIONS (0 = auto) is the whole budget of
    descriptors for clients, a quarter of it gRPC's when GRPC_PORT serves (a gRPC client multiplexes
    its calls on one connection)."""
    total = max_connections or auto_max_connections()
    grpc = total // 4 if grpc_port is not None else 0
    return total - grpc, grpc


class Guard:
    """The process's connections (oldest first) and the body bytes still arriving."""

    counter: Any = None  # bert_connections_refused_total, once an app has made its metrics

    def __init__(self, limits: Limits, keys: KeyRule, cors: bool):
        self.limits, self.keys, self.cors = limits, keys, cors
        self.open: dict[GuardedHttp, None] = {}
        self.refusing: dict[GuardedHttp, None] = {}  # open, refused, their answers delayed
        self.pending_body_bytes = 0

    @classmethod
    def from_settings(cls) -> Guard:
        from app.settings import Settings

        s = Settings()
        limits = Limits(
            s.header_timeout_s,
            s.max_header_bytes,
            s.body_timeout_s,
            int(s.max_pending_body_mb * MB),
            connection_budget(s.max_connections, s.grpc_port)[0],
            s.max_batch_items,
            s.max_choices,
            s.refusal_delay_ms / 1000,
        )
        return cls(limits, KeyRule(s.api_key, s.admin_api_key), cors=bool(s.cors_origin_list))

    def count(self, reason: str) -> None:
        if Guard.counter is not None:
            Guard.counter.labels(reason).inc()

    def oldest_waiting(self) -> GuardedHttp | None:
        """The connection to close for a new one: the oldest waiting for a refusal (`refuse`'s
        delay), else the oldest that has never completed a request and is only sending headers (or
        nothing), else the oldest idle between requests. A client that was served keeps its
        connection while any attacker's is left."""
        if self.refusing:  # its answer would be a 4xx anyway
            return next(iter(self.refusing))
        served = None  # one pass, mostly ending at the first: under a flood the oldest is an attacker's
        for c in self.open:
            if c.waiting:
                if not c.served:
                    return c
                served = served or c
        return served


class GuardedHttp(HttpToolsProtocol):
    guard: Guard | None = None  # one per process, made from Settings at the first connection

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if GuardedHttp.guard is None:
            GuardedHttp.guard = Guard.from_settings()
        self.g = GuardedHttp.guard
        # No `server` header, whatever uvicorn was told: it names the software to attackers.
        defaults = self.server_state.default_headers
        defaults[:] = [(name, value) for name, value in defaults if name.lower() != b"server"]
        self.reading_headers = True
        self.header_bytes = 0
        self.tail = b""  # the last bytes seen, to find the headers' end across chunks
        self.body_bytes = 0  # of the current request, counted in the guard's pending bytes
        self.closed = False
        self.timer: asyncio.TimerHandle | None = None
        self.request_cycle: Any = None  # the ASGI cycle of the request being read or answered
        self.served = False  # a request of its has been answered
        self.v2_head = 0  # a V2 binary request's JSON header length, while the app waits for it
        self.v2_path, self.held = "", b""  # that request's path, and its body so far

    @property
    def waiting(self) -> bool:
        """Sending a request line and headers, or idle: nothing of its would be lost by closing it."""
        return self.reading_headers and (self.request_cycle is None or self.request_cycle.response_complete)

    # ------------------------------------------------------------------ connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.g.open) >= self.g.limits.max_connections:
            victim = self.g.oldest_waiting()
            if victim is None:
                self.g.count("max_connections")
                self.refuse(ServerBusy(f"too many open connections ({len(self.g.open)}); retry later"))
                return
            self.g.count("evicted")
            victim.drop()
        self.g.open[self] = None
        self.arm(self.g.limits.header_timeout_s, self.headers_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.g.open.pop(self, None)
        self.g.refusing.pop(self, None)
        self.release_body()
        self.disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.reading_headers:
            if self.header_bytes == 0 and self.timer is None:  # a new request's first byte
                self.arm(self.g.limits.header_timeout_s, self.headers_timed_out)
            window = self.tail + data
            end = window.find(HEADERS_END)
            self.header_bytes += len(data) if end < 0 else max(0, end + len(HEADERS_END) - len(self.tail))
            if self.header_bytes > self.g.limits.max_header_bytes:
                self.g.count("max_header_bytes")
                self.refuse(
                    HeadersTooLarge(f"request line and headers exceed {self.g.limits.max_header_bytes} bytes")
                )
                return
            self.tail = window[-(len(HEADERS_END) - 1) :]
        super().data_received(data)

    # ------------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.request_cycle = None

    def on_headers_complete(self) -> None:
        if self.closed:
            return
        self.reading_headers, self.header_bytes, self.tail = False, 0, b""
        self.disarm()
        path = self.answerable_path()
        message = None if path is None else self.unauthorized(path)
        if path is not None and message is not None:
            self.g.count("unauthorized")
            self.refuse(Unauthorized(message), v2=is_v2_path(path), slowly=True)
            return
        declared = next((v for k, v in self.headers if k == b"content-length"), b"0")
        if (
            declared.isdigit()
            and self.g.pending_body_bytes + int(declared) > self.g.limits.max_pending_body_bytes
        ):
            self.g.count("max_pending_body")
            self.refuse(
                ServerBusy("the server is receiving too many request bodies; retry later"), slowly=True
            )
            return
        self.arm(self.g.limits.body_timeout_s, self.body_timed_out)
        self.v2_head = 0 if path is None else self.v2_header_bytes(path)
        if self.v2_head:
            self.v2_path, self.held = path or "", b""
            return  # the app starts once the V2 JSON header is in (on_body)
        self.start_app()

    def start_app(self) -> None:
        self.v2_head = 0
        super().on_headers_complete()
        self.request_cycle = self.cycle

    def on_response_complete(self) -> None:
        self.served = True
        super().on_response_complete()

    def on_body(self, body: bytes) -> None:
        if self.closed:
            return
        self.body_bytes += len(body)
        self.g.pending_body_bytes += len(body)
        if self.g.pending_body_bytes > self.g.limits.max_pending_body_bytes:
            self.g.count("max_pending_body")
            self.refuse(ServerBusy("the server is receiving too many request bodies; retry later"))
            return
        if self.v2_head:
            body = self.held + body if self.held else body  # mostly the first chunk holds the header
            if len(body) < self.v2_head:
                self.held = body
                return
            head, self.held = body[: self.v2_head], b""
            limits = self.g.limits
            error = precount(self.v2_path, head, limits.max_items, limits.max_choices)  # None if not JSON
            if error is not None:
                self.g.count("v2_shapes")
                self.refuse(error, v2=True, slowly=True)
                return
            self.start_app()
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.closed:
            return
        if self.v2_head:  # the body ended inside its V2 header: the app words that
            held, self.held = self.held, b""
            self.start_app()
            if held:
                super().on_body(held)
        self.release_body()
        self.disarm()
        self.reading_headers = True  # whatever comes next is the next request's line and headers
        super().on_message_complete()

    def answerable_path(self) -> str | None:
        """The request's path, as uvicorn will give it to the app, when this layer may answer for
        the app; None when it may not (pipelined behind an answer still being written, a preflight,
        an upgrade) or cannot parse the URL (uvicorn answers that)."""
        if self.cycle is not None and not self.cycle.response_complete:
            return None
        if self.parser.get_method() == b"OPTIONS" or self.parser.should_upgrade():
            return None
        try:
            path = httptools.parse_url(self.url).path.decode("ascii")
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
            return None
        return self.root_path + (urllib.parse.unquote(path) if "%" in path else path)

    def unauthorized(self, path: str) -> str | None:
        """The 401's message when the headers lack the key that `path` needs (app/api/auth.py)."""
        if self.g.keys.keyless:
            return None
        authorization, origin = "", False
        for name, value in self.headers:
            if name == b"authorization" and not authorization:
                authorization = value.decode("latin-1")
            origin = origin or name == b"origin"
        if origin and self.g.cors:
            return None  # the app's 401 carries the CORS headers a browser needs to read it
        return self.g.keys.refusal(path, authorization)

    def v2_header_bytes(self, path: str) -> int:
        """A V2 binary request's JSON header length, when it is to be checked here (small, and the
        client not waiting for 100-continue, which the app sends); else 0."""
        if self.expect_100_continue:
            return 0
        value = next((v for k, v in self.headers if k == b"inference-header-content-length"), b"")
        length = v2_header_length(path, value.decode("latin-1"))
        return length if length is not None and length <= PRECOUNT_BYTES else 0

    # ------------------------------------------------------------------ timers and refusals
    def headers_timed_out(self) -> None:
        self.timer = None
        self.g.count("header_timeout")
        self.refuse(
            RequestTimeout(
                f"request line and headers not received within {self.g.limits.header_timeout_s:g} s"
            )
        )

    def body_timed_out(self) -> None:
        self.timer = None
        self.g.count("body_timeout")
        self.refuse(RequestTimeout(f"request body not received within {self.g.limits.body_timeout_s:g} s"))

    def arm(self, seconds: float, callback: Any, *args: Any) -> None:
        self.disarm()
        self.timer = self.loop.call_later(seconds, callback, *args)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def release_body(self) -> None:
        self.g.pending_body_bytes -= self.body_bytes
        self.body_bytes = 0

    def refuse(self, error: ServiceError, v2: bool = False, slowly: bool = False) -> None:
        """Answer `error` unless an answer has started, and close. `slowly`: before the app has
        the request, answer after REFUSAL_DELAY_MS with the connection paused."""
        if self.closed:
            return
        delay = self.g.limits.refusal_delay_s if slowly and self.request_cycle is None else 0
        if delay > 0:
            self.closed = True  # nothing more is read or parsed
            self.g.refusing[self] = None
            self.transport.pause_reading()
            self.release_body()
            self.arm(delay, self.answer, error, v2)  # drop() (eviction, a lost connection) cancels it
            return
        self.answer(error, v2)

    def answer(self, error: ServiceError, v2: bool) -> None:
        if self.request_cycle is None or not self.request_cycle.response_started:
            self.transport.write(raw_error(error, v2))
        if self.request_cycle is not None:  # the access log's status for the request the app saw
            self.request_cycle.scope[REFUSED_SCOPE_KEY] = status_of(error).status
        self.drop()

    def drop(self) -> None:
        self.closed = True
        self.disarm()
        self.g.open.pop(self, None)
        self.g.refusing.pop(self, None)
        self.release_body()
        cycle = self.request_cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()  # the app's receive() returns http.disconnect
        self.transport.close()
