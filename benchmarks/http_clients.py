"""What an HTTP client costs the load generator: benchmarks/rawhttp.py against httpx and aiohttp.

    python -m benchmarks.http_clients               # ~1 min on 2 cores
    python -m benchmarks.http_clients --requests 500 --rounds 1 --name http_clients_quick

The load generator shares the cores with the server it measures, so every CPU-millisecond the
client spends per request is taken from the server. Each client sends the same /classify-sized
JSON POSTs over keep-alive connections to a minimal asyncio server in another process (a fixed
answer, so the server costs the same for all), at concurrency 1 and 32. Measured: the client
process' CPU time per request, and requests per second. Rounds alternate the clients; medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchmarks import rawhttp
from benchmarks.bench_common import RESULTS, ROOT, free_port, machine_info, now, write_results

PAYLOAD = {"text": "A wonderful, moving film with a brilliant cast, though the second half drags a little."}
ANSWER = json.dumps({"label": "positive", "score": 0.99698, "truncated": False, "windows": 1}).encode()
CLIENTS = ("rawhttp", "httpx", "aiohttp")


# ----------------------------------------------------------------------------- the server


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(ANSWER)
    try:
        while True:
            request = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in request.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            writer.write(head + ANSWER)
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def serve(port: int) -> None:
    server = await asyncio.start_server(answer, "127.0.0.1", port, backlog=256)
    async with server:
        await server.serve_forever()


# ----------------------------------------------------------------------------- the clients


async def closed_loop(send: Callable[[], Awaitable[int]], requests: int, concurrency: int) -> None:
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            if await send() != 200:
                raise RuntimeError("the server did not answer 200")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def run_client(client: str, url: str, requests: int, concurrency: int) -> dict[str, float]:
    """Wall time and this process' CPU time for `requests` POSTs, after a short warm-up."""

    async def measured(send: Callable[[], Awaitable[int]]) -> dict[str, float]:
        await closed_loop(send, min(200, requests), concurrency)  # connections open, code warm
        cpu, wall = time.process_time(), time.perf_counter()
        await closed_loop(send, requests, concurrency)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return {"cpu_ms_per_request": 1000 * cpu / requests, "requests_per_s": requests / wall}

    if client == "rawhttp":
        pool = rawhttp.ConnectionPool(*rawhttp.host_port(url))
        raw = rawhttp.post_json("/classify", PAYLOAD)

        async def send_raw() -> int:
            return (await pool.request(raw)).status

        try:
            return await measured(send_raw)
        finally:
            await pool.close()
    if client == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, limits=limits) as http:

            async def send_httpx() -> int:
                return (await http.post("/classify", json=PAYLOAD)).status_code

            return await measured(send_httpx)
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base_url=url, connector=connector) as session:

        async def send_aiohttp() -> int:
            async with session.post("/classify", json=PAYLOAD) as response:
                await response.read()
                return response.status

        return await measured(send_aiohttp)


# ----------------------------------------------------------------------------- report


def markdown(report: dict) -> str:
    lines = [
        "# HTTP client cost in the load generator",
        "",
        f"Generated {report['generated']} by `{report['command']}`: {report['requests']} keep-alive JSON",
        "POSTs per client and concurrency against a fixed-answer asyncio server in another process;",
        f"median of {report['rounds']} alternating rounds. Client CPU = the client process' CPU time.",
        "",
        "| concurrency | client | client CPU ms / request | requests / s | CPU vs rawhttp |",
        "|---:|---|---:|---:|---:|",
    ]
    for concurrency, clients in report["results"].items():
        base = clients["rawhttp"]["cpu_ms_per_request"]
        for client, r in clients.items():
            ratio = r["cpu_ms_per_request"] / base
            cpu, rate = r["cpu_ms_per_request"], r["requests_per_s"]
            lines.append(f"| {concurrency} | {client} | {cpu:.3f} | {rate:.0f} | {ratio:.2f}× |")
    lines += ["", report["verdict"], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_clients", description=__doc__)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--name", default="http_clients")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        asyncio.run(serve(args.serve))
        return 0
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.http_clients", "--serve", str(port)], cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                asyncio.run(run_client("rawhttp", url, 1, 1))
                break
            except (rawhttp.HTTPError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        levels = [int(c) for c in args.concurrency.split(",")]
        samples: dict[int, dict[str, list[dict]]] = {c: {k: [] for k in CLIENTS} for c in levels}
        for _ in range(args.rounds):
            for concurrency in levels:
                for client in CLIENTS:
                    result = asyncio.run(run_client(client, url, args.requests, concurrency))
                    samples[concurrency][client].append(result)
                    print(f"c={concurrency} {client}: {result}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    results = {
        str(c): {
            client: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            for client, runs in clients.items()
        }
        for c, clients in samples.items()
    }
    ratios = [
        min(clients[other]["cpu_ms_per_request"] for other in ("httpx", "aiohttp"))
        / clients["rawhttp"]["cpu_ms_per_request"]
        for clients in results.values()
    ]
    wins = min(ratios) >= 1.5
    verdict = (
        f"rawhttp spends {min(ratios):.1f}–{max(ratios):.1f}× less client CPU per request than the cheaper "
        "of httpx and aiohttp: "
        + ("it clearly wins, so the load generator keeps it." if wins else "not a clear win.")
    )
    report = {
        "generated": now(),
        "command": " ".join(
            ["python -m benchmarks.http_clients", *(argv if argv is not None else sys.argv[1:])]
        ),
        "requests": args.requests,
        "rounds": args.rounds,
        "machine": machine_info(),
        "results": results,
        "verdict": verdict,
    }
    write_results(args.out, args.name, report, markdown(report), None)
    print(verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
