"""A lean HTTP/1.1 keep-alive client for load generation (asyncio streams, no dependencies).

On a small machine the load generator shares the CPU with the server it measures. httpx spends
roughly a millisecond of Python per request building and parsing messages; that time is charged
to the server's latency at concurrency 1 and taken from its CPU at high concurrency. This client
sends pre-encoded request bytes and reads a Content-Length (or chunked) response, like wrk does,
so what the benchmark measures is the server.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass


class HTTPError(Exception):
    """The connection failed or the server broke the protocol."""


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300


def encode_request(method: str, host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    if body:
        lines.append("Content-Type: application/json")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    """One keep-alive connection; reconnects after the server closes it."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None

    async def request(self, raw: bytes) -> RawResponse:
        """Send pre-encoded request bytes; TimeoutError past timeout_s, HTTPError on a broken exchange."""
        try:
            return await asyncio.wait_for(self._exchange(raw), self.timeout_s)
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            await self.close()
            raise HTTPError(f"{type(e).__name__}: {e}") from e
        except asyncio.TimeoutError:
            await self.close()  # a late response must not be read as the next one's
            raise

    async def _exchange(self, raw: bytes) -> RawResponse:
        if self.writer is None:
            await self._connect()
        assert self.reader is not None and self.writer is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._read_chunked()
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return RawResponse(status, headers, body)

    async def _read_chunked(self) -> bytes:
        assert self.reader is not None
        parts = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await self.reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                return b"".join(parts)
            parts.append(chunk[:-2])


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the raw client speaks plain http only, got {url!r}")
    return parts.hostname, parts.port or 80
