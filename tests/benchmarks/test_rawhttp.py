"""benchmarks/rawhttp.py against a tiny asyncio server that drops kept-alive connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from benchmarks.rawhttp import ConnectionPool, HTTPError, post_json

BODY = json.dumps({"ok": True}).encode()


class DroppingServer:
    """Answers `answers_per_connection` requests per connection, then closes it, silently or
    (with `read_then_drop`) after reading the next request without answering it."""

    def __init__(self, answers_per_connection: int, read_then_drop: bool = False):
        self.answers_per_connection, self.read_then_drop = answers_per_connection, read_then_drop
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                self.requests += 1
                if answered == self.answers_per_connection:
                    break  # read_then_drop: the request is read but never answered
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(BODY)}\r\n\r\n".encode()
                    + BODY
                )
                await writer.drain()
                answered += 1
                if answered == self.answers_per_connection and not self.read_then_drop:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


@contextlib.asynccontextmanager
async def pool_on(server: DroppingServer) -> AsyncIterator[ConnectionPool]:
    """The server listening on a free port, and a client pool for it; both closed afterwards."""
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    pool = ConnectionPool("127.0.0.1", srv.sockets[0].getsockname()[1])
    try:
        yield pool
    finally:
        await pool.close()
        srv.close()
        await srv.wait_closed()


async def test_connection_closed_while_idle_is_replaced():
    """The keep-alive timeout case: the server closes an idle connection; the next request
    must go out on a new one instead of failing."""
    server = DroppingServer(answers_per_connection=1)
    async with pool_on(server) as pool:
        for _ in range(3):
            response = await pool.request(post_json("/x", {"n": 1}))
            assert response.status == 200 and response.json() == {"ok": True}
            await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
    assert server.connections == 3 and server.requests == 3


async def test_reused_connection_dropped_before_answering_is_retried_once():
    server = DroppingServer(answers_per_connection=1, read_then_drop=True)
    async with pool_on(server) as pool:
        for _ in range(3):  # no pause: the drop is only seen when the next request is sent
            assert (await pool.request(post_json("/x", {}))).status == 200
    assert server.connections == 3


async def test_fresh_connection_dropped_without_answer_is_an_error():
    server = DroppingServer(answers_per_connection=0, read_then_drop=True)
    async with pool_on(server) as pool:
        with pytest.raises(HTTPError, match="closed"):
            await pool.request(post_json("/x", {}))
    assert server.connections == 1  # not retried: a new connection that drops is a real failure
