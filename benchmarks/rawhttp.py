"""A lean HTTP/1.1 keep-alive client over asyncio streams, for load the client must not limit: on a
small machine the client's CPU is taken from the server it measures (docs/decisions.md, http_clients:
httpx 0.5-1.9 ms of CPU per request, aiohttp 0.08-0.10 ms, this 0.02-0.03 ms). Requests are
pre-encoded bytes; responses are parsed just enough for status, headers and body, as wrk does.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any


class HTTPError(Exception):
    """The connection failed or the server broke the protocol."""


class _ClosedIdle(Exception):
    """A kept-alive connection was closed by the server before it answered anything."""


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def encode_request(
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> bytes:
    all_headers = {"Host": host, **(headers or {})}
    if body is not None:
        all_headers = {"Content-Type": "application/json", **all_headers, "Content-Length": str(len(body))}
    head = [f"{method} {path} HTTP/1.1", *(f"{name}: {value}" for name, value in all_headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")


def post_json(path: str, payload: Any, headers: dict[str, str] | None = None) -> bytes:
    return encode_request("POST", path, json.dumps(payload).encode("utf-8"), headers)


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)
    }
    if headers.get("transfer-encoding", "").lower() != "chunked":
        length = int(headers.get("content-length", "0"))
        return RawResponse(int(status_line.split(" ", 2)[1]), headers, await reader.readexactly(length))
    parts = []
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        parts.append((await reader.readexactly(size + 2))[:-2])  # the chunk and its CRLF
    await reader.readexactly(2)  # the last chunk's CRLF
    return RawResponse(int(status_line.split(" ", 2)[1]), headers, b"".join(parts))


@dataclass
class ConnectionPool:
    """Keep-alive connections to one host. A connection that failed, timed out or was closed by the
    server is dropped, so a late response is never read as the next request's."""

    host: str
    port: int
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    async def request(self, raw: bytes, timeout_s: float = 30.0) -> RawResponse:
        """Send pre-encoded bytes; TimeoutError, or HTTPError for a broken exchange. A reused connection
        that closes before answering a byte (the server closed it idle, so it never saw the request) is
        retried once on a new one, as httpx and browsers do."""
        while self.idle:
            reader, writer = self.idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            try:
                return await self._exchange(reader, writer, raw, timeout_s, reused=True)
            except _ClosedIdle:
                continue
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as e:
            raise HTTPError(f"cannot connect: {e}") from e
        return await self._exchange(reader, writer, raw, timeout_s, reused=False)

    async def _exchange(self, reader, writer, raw: bytes, timeout_s: float, reused: bool) -> RawResponse:
        try:
            writer.write(raw)
            response = await asyncio.wait_for(read_response(reader), timeout_s)
        except asyncio.IncompleteReadError as e:
            writer.close()
            if reused and not e.partial:
                raise _ClosedIdle from e
            raise HTTPError(f"connection closed mid-response: {e}") from e
        except (OSError, asyncio.LimitOverrunError, ValueError) as e:
            writer.close()
            if reused and isinstance(e, ConnectionResetError):
                raise _ClosedIdle from e
            raise HTTPError(f"{type(e).__name__}: {e}") from e
        except BaseException:
            writer.close()
            raise
        if response.headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append((reader, writer))
        return response

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the raw client speaks plain http only, got {url!r}")
    return parts.hostname, parts.port or 80
