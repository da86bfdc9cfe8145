"""Overload: twice the saturating arrival rate for a few seconds against a live server.

The saturating rate is measured first (closed loop, just under the in-flight limit), then requests
arrive open loop at twice that rate, each sent whatever the server does. Every request must get an
HTTP response; accepted ones complete with a valid answer, the excess is refused quickly with 429
and Retry-After, throughput does not collapse, and memory does not grow.

The client is benchmarks/rawhttp.py: httpx costs about a millisecond of CPU per request,
which on a small shared machine would make the client, not the server, the bottleneck.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import pytest

from benchmarks.rawhttp import ConnectionPool, RawResponse, post_json
from tests.reliability.live import LiveServer, start_server

MAX_IN_FLIGHT = 16
PROBE_S, OVERLOAD_S = 2.0, 3.0
# A context of ~6 windows at max_seq_len 64: each request is several work items.
QA = {
    "question": "Where does John Smith live?",
    "context": "John Smith lives in Paris, near the river. " * 30,
}


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    live = start_server(
        models_dir,
        tmp_path_factory.mktemp("overload"),
        MAX_IN_FLIGHT=str(MAX_IN_FLIGHT),
        MAX_WAIT_MS="2",
    )
    try:
        assert live.wait_ready().status_code == 200
        yield live
    finally:
        live.stop()


@dataclass
class Outcome:
    status: int | str  # HTTP status, or the exception's name when no response came
    latency_s: float  # from the scheduled arrival time
    response: RawResponse | None = None


async def closed_loop_rate(pool: ConnectionPool, raw: bytes, workers: int, seconds: float) -> float:
    """Answered-with-200 requests per second with `workers` clients each sending back to back."""
    loop = asyncio.get_running_loop()
    end, ok = loop.time() + seconds, 0

    async def worker() -> None:
        nonlocal ok
        while loop.time() < end:
            response = await pool.request(raw)  # not `ok += await ...`: that reads `ok` first
            ok += response.status == 200

    started = loop.time()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return ok / (loop.time() - started)


async def open_loop(pool: ConnectionPool, raw: bytes, rate: float, seconds: float) -> list[Outcome]:
    """Send request i at start + i / rate, whatever the server does; never drop one."""
    loop = asyncio.get_running_loop()
    outcomes: list[Outcome] = []

    async def one(due: float) -> None:
        try:
            response = await pool.request(raw, timeout_s=30)
            outcomes.append(Outcome(response.status, loop.time() - due, response))
        except Exception as error:  # noqa: BLE001 - an unanswered request is what we count
            outcomes.append(Outcome(type(error).__name__, loop.time() - due))

    started, tasks = loop.time(), []
    for i in range(int(rate * seconds)):
        due = started + i / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    return outcomes


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else (values or [0.0])[0]


def rejected_count(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("bert_rejected_total{") and 'task="qa"' in line
        and ('reason="in_flight_limit"' in line or 'reason="queue_full"' in line)
    )  # fmt: skip


async def test_twice_the_saturating_rate_is_answered_and_shed_quickly(server):
    pool = ConnectionPool("127.0.0.1", server.port)
    raw = post_json("/qa", QA)
    await closed_loop_rate(pool, raw, workers=4, seconds=0.5)  # warm up
    saturation = await closed_loop_rate(pool, raw, workers=MAX_IN_FLIGHT - 4, seconds=PROBE_S)
    rss_before, rejected_before = server.rss_mb(), rejected_count(server)

    rate = 2 * saturation
    started = time.perf_counter()
    outcomes = await open_loop(pool, raw, rate, OVERLOAD_S)
    elapsed = time.perf_counter() - started
    await pool.close()
    rss_after = server.rss_mb()

    statuses = Counter(o.status for o in outcomes)
    ok = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    summary = (
        f"saturation {saturation:.0f} req/s, offered {rate:.0f} req/s for {OVERLOAD_S}s: {dict(statuses)}; "
        f"goodput {len(ok) / elapsed:.0f} req/s; 200 p50/p99 {p([o.latency_s for o in ok], 50):.3f}/"
        f"{p([o.latency_s for o in ok], 99):.3f}s; 429 p50/p95 {p([o.latency_s for o in refused], 50):.3f}/"
        f"{p([o.latency_s for o in refused], 95):.3f}s; RSS {rss_before:.0f} -> {rss_after:.0f} MB"
    )
    print(summary)

    # Every request got an HTTP response, and only "served" or "refused".
    assert len(outcomes) == int(rate * OVERLOAD_S) and set(statuses) <= {200, 429}, summary
    # The excess was refused, quickly, with a retry hint, and every refusal was counted.
    assert len(refused) >= 0.15 * len(outcomes), summary
    assert p([o.latency_s for o in refused], 95) < 1.0, summary
    for outcome in refused:
        assert outcome.response is not None and outcome.response.headers.get("retry-after") == "1"
        assert outcome.response.json()["error"] == "overloaded"
    assert rejected_count(server) - rejected_before == len(refused)
    # Accepted requests completed with an answer, in bounded time, and throughput held up.
    assert ok and all(o.response is not None and o.response.json()["answers"] for o in ok)
    assert p([o.latency_s for o in ok], 99) < 3.0, summary
    assert len(ok) / elapsed >= 0.3 * saturation, summary
    # Memory did not grow with the backlog, and the server serves normally right after.
    assert rss_after - rss_before < 50, summary
    assert httpx.get(f"{server.url}/ready", timeout=5).status_code == 200
    began = time.perf_counter()
    assert httpx.post(f"{server.url}/qa", json=QA, timeout=10).status_code == 200
    assert time.perf_counter() - began < 2.0
