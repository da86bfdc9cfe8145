"""A minimal HTTP/1.1 client over asyncio streams, for load that the client itself must not limit.

httpx spends about a millisecond of CPU per request; on a small shared machine that makes the
client, not the server, the bottleneck of an overload test. Here a request is pre-encoded bytes
and a response is parsed just enough to get its status, headers and body.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def encode_request(
    method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    all_headers = (
        {"Content-Type": "application/json", **(headers or {})} if body is not None else dict(headers or {})
    )
    if body is not None:
        all_headers["Content-Length"] = str(len(body))
    lines += [f"{name}: {value}" for name, value in all_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def post_json(path: str, payload: Any, headers: dict[str, str] | None = None) -> bytes:
    return encode_request("POST", path, json.dumps(payload).encode("utf-8"), headers)


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return RawResponse(int(status_line.split(" ", 2)[1]), headers, body)


@dataclass
class ConnectionPool:
    """Keep-alive connections to one host; a request takes an idle one or opens a new one."""

    host: str
    port: int
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    async def request(self, raw: bytes, timeout_s: float = 30.0) -> RawResponse:
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(raw)
            response = await asyncio.wait_for(read_response(reader), timeout_s)
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
