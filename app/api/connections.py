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
- MAX_CONNECTIONS: at the cap, a new connection closes the oldest connection that has never been
  answered and is only sending headers (or nothing), else the oldest one idling between requests,
  so a probe or a real client always gets in and a served client keeps its connection; when every
  connection is busy with a request, the new one gets 503 and is closed.
Idle keep-alive is uvicorn's own `--timeout-keep-alive`. Refusals are written on the socket
before any ASGI request exists, with the statuses of app/api/error_table.py.

    uvicorn app.main:app --http app.api.connections:GuardedHttp --no-server-header
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.error_table import raw_error, status_of
from app.errors import HeadersTooLarge, RequestTimeout, ServerBusy, ServiceError

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


def auto_max_connections() -> int:
    """Below the open-file limit, so that accept() never fails for lack of descriptors (which would
    refuse everyone), with room for the models' files, logs and sockets of the process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(4096, soft - 128)) if soft != resource.RLIM_INFINITY else 4096


def limits_from_settings() -> Limits:
    from app.settings import Settings

    s = Settings()
    return Limits(
        s.header_timeout_s,
        s.max_header_bytes,
        s.body_timeout_s,
        int(s.max_pending_body_mb * MB),
        s.max_connections or auto_max_connections(),
    )


class Guard:
    """The process's connections (oldest first) and the body bytes still arriving."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.open: dict[GuardedHttp, None] = {}
        self.pending_body_bytes = 0
        self.refused: dict[str, int] = {}  # reason -> count (logged at shutdown of a connection flood)

    def count(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def oldest_waiting(self) -> GuardedHttp | None:
        """The connection to close for a new one: the oldest that has never completed a request
        and is only sending headers (or nothing), else the oldest idle between requests. A client
        that was served keeps its connection while any attacker's is left."""
        waiting = [c for c in self.open if c.waiting]
        return next((c for c in waiting if not c.served), waiting[0] if waiting else None)


class GuardedHttp(HttpToolsProtocol):
    guard: Guard | None = None  # one per process, made from Settings at the first connection

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if GuardedHttp.guard is None:
            GuardedHttp.guard = Guard(limits_from_settings())
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
        declared = next((v for k, v in self.headers if k == b"content-length"), b"0")
        if (
            declared.isdigit()
            and self.g.pending_body_bytes + int(declared) > self.g.limits.max_pending_body_bytes
        ):
            self.g.count("max_pending_body")
            self.refuse(ServerBusy("the server is receiving too many request bodies; retry later"))
            return
        self.arm(self.g.limits.body_timeout_s, self.body_timed_out)
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
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.closed:
            return
        self.release_body()
        self.disarm()
        self.reading_headers = True  # whatever comes next is the next request's line and headers
        super().on_message_complete()

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

    def arm(self, seconds: float, callback: Any) -> None:
        self.disarm()
        self.timer = self.loop.call_later(seconds, callback)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def release_body(self) -> None:
        self.g.pending_body_bytes -= self.body_bytes
        self.body_bytes = 0

    def refuse(self, error: ServiceError) -> None:
        """Answer `error` unless an answer has started, and close."""
        if self.closed:
            return
        if self.request_cycle is None or not self.request_cycle.response_started:
            self.transport.write(raw_error(error))
        if self.request_cycle is not None:  # the access log's status for the request the app saw
            self.request_cycle.scope[REFUSED_SCOPE_KEY] = status_of(error).status
        self.drop()

    def drop(self) -> None:
        self.closed = True
        self.disarm()
        self.g.open.pop(self, None)
        self.release_body()
        cycle = self.request_cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()  # the app's receive() returns http.disconnect
        self.transport.close()
