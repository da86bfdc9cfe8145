"""Load generator for the BERT service: open-loop (constant arrival rate) or closed-loop.

Open loop (`--rate R`): request i is due at start + i/R and its latency counts from then (no
coordinated omission); a due request finding `--concurrency` in flight is dropped and counted, as
k6's constant-arrival-rate does. Closed loop (`--concurrency N`, no `--rate`): N workers back to back.

    python -m benchmarks.loadgen --rate 50 --duration 30 --out results/load.json
    python -m benchmarks.loadgen --concurrency 8 --max-requests 2000 --endpoints classify=3,qa=1

Only loopback targets are allowed unless --allow-remote is given.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import random
import sys
import time
import urllib.parse
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import rawhttp
from benchmarks.loadgen_payloads import (
    ENDPOINTS,
    PATHS,
    POOL_SIZES,
    PROTOCOLS,
    from_wire,
    make_payload,
    to_wire,
    validate_response,
)

if TYPE_CHECKING:
    import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
POOL_SIZE = 64  # distinct payloads prepared per endpoint before the clock starts


def parse_mix(spec: str) -> dict[str, float]:
    """'classify=3,qa=1' or 'classify,ner' or 'all' -> endpoint weights."""
    if spec.strip() == "all":
        return dict.fromkeys(ENDPOINTS, 1.0)
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, weight = part.partition("=")
        if name not in PATHS:
            raise ValueError(f"unknown endpoint {name!r} in --endpoints; choose from {sorted(PATHS)}")
        try:
            mix[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"weight {weight!r} for {name} is not a number") from None
        if mix[name] < 0:
            raise ValueError(f"weight for {name} is negative")
    if not mix or sum(mix.values()) <= 0:
        raise ValueError(f"--endpoints {spec!r} selects nothing")
    return mix


def check_target(url: str, allow_remote: bool = False) -> None:
    """Refuse anything but a loopback http(s) URL unless allow_remote: never load-test by accident."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {url!r} is not an http(s) URL with a host")
    if allow_remote or parts.hostname == "localhost":
        return
    try:
        if ipaddress.ip_address(parts.hostname).is_loopback:
            return
    except ValueError:
        pass  # a host name other than localhost: not provably loopback
    raise ValueError(f"refusing non-loopback target {parts.hostname!r}; pass --allow-remote if it is yours")


@dataclass
class LoadConfig:
    url: str = DEFAULT_URL
    rate: float | None = None  # requests/s (open loop); None = closed loop
    duration_s: float | None = 10.0
    max_requests: int | None = None
    concurrency: int = 64  # open loop: in-flight cap; closed loop: number of workers
    endpoints: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENDPOINTS, 1.0))
    timeout_s: float = 30.0
    seed: int = 0
    api_key: str | None = None
    allow_remote: bool = False
    check_schema: bool = True
    client: str = "raw"  # "raw" (benchmarks/rawhttp.py, lean) or "httpx"
    protocol: str = "ours"  # or a peer's: loadgen_payloads.PROTOCOLS

    def validate(self) -> None:
        check_target(self.url, self.allow_remote)
        unknown = sorted(set(self.endpoints) - set(PATHS))
        problems = [
            (self.rate is not None and self.rate <= 0, "--rate must be > 0"),
            (self.duration_s is None and self.max_requests is None, "give --duration or --max-requests"),
            (self.duration_s is not None and self.duration_s <= 0, "--duration must be > 0"),
            (self.max_requests is not None and self.max_requests < 1, "--max-requests must be >= 1"),
            (self.concurrency < 1, "--concurrency must be >= 1"),
            (self.client not in ("raw", "httpx"), f"--client must be raw or httpx, got {self.client!r}"),
            (
                self.client == "raw" and not self.url.startswith("http://"),
                "the raw client speaks plain http; use --client httpx for https",
            ),
            (self.protocol not in PROTOCOLS, f"--protocol must be one of {PROTOCOLS}"),
            (bool(unknown), f"unknown endpoints {unknown}"),
        ]
        for failed, message in problems:
            if failed:
                raise ValueError(message)


@dataclass
class Sample:
    endpoint: str
    status: str  # HTTP code as text, or "timeout" / "connection_error"
    latency_s: float
    schema_error: str | None = None
    sent_at: float = 0.0  # time.perf_counter() when the request was due


def percentiles(values: list[float]) -> dict[str, float | None]:
    """mean/p50/p95/p99/max in milliseconds (linear interpolation); None when empty."""
    keys = ("mean", "p50", "p95", "p99", "max")
    if not values:
        return dict.fromkeys(keys)
    ordered = sorted(values)

    def pct(q: float) -> float:
        pos = (len(ordered) - 1) * q
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    stats = [sum(ordered) / len(ordered), pct(0.5), pct(0.95), pct(0.99), ordered[-1]]
    return {k: round(v * 1000, 3) for k, v in zip(keys, stats, strict=True)}


def _summary(samples: list[Sample], elapsed_s: float) -> dict[str, Any]:
    ok = [s for s in samples if s.status.startswith("2") and s.schema_error is None]
    statuses = Counter(s.status for s in samples)
    return {
        "requests": len(samples),
        "ok": len(ok),
        "errors": len(samples) - len(ok),
        "throughput_rps": round(len(ok) / elapsed_s, 3) if elapsed_s > 0 else 0.0,
        "latency_ms": percentiles([s.latency_s for s in ok]),
        "status_codes": dict(sorted(statuses.items())),
        "errors_by_status": {k: v for k, v in sorted(statuses.items()) if not k.startswith("2")},
        "schema_errors": sum(s.schema_error is not None for s in samples),
    }


def build_report(config: LoadConfig, samples: list[Sample], elapsed_s: float, dropped: int) -> dict[str, Any]:
    key = "***" if config.api_key else None
    return {
        "config": {**asdict(config), "api_key": key, "mode": "open" if config.rate else "closed"},
        "elapsed_s": round(elapsed_s, 3),
        "dropped": dropped,
        **_summary(samples, elapsed_s),
        "schema_error_examples": sorted({s.schema_error for s in samples if s.schema_error})[:5],
        "endpoints": {
            n: _summary([s for s in samples if s.endpoint == n], elapsed_s) for n in config.endpoints
        },
    }


class _Runner:
    """Issues requests and records samples. Responses are kept and checked against the schema
    after the clock stops, so parsing them costs the measured server no CPU."""

    def __init__(self, config: LoadConfig, send, stop: asyncio.Event | None, samples: list[Sample] | None):
        self.config, self.send, self.stop = config, send, stop
        self.rng = rng = random.Random(config.seed)
        self.names = names = [n for n, w in config.endpoints.items() if w > 0]
        self.weights = [config.endpoints[n] for n in self.names]
        self.pools = {n: [make_payload(n, rng) for _ in range(POOL_SIZES.get(n, POOL_SIZE))] for n in names}
        self.wire = {n: [to_wire(config.protocol, n, p) for p in pool] for n, pool in self.pools.items()}
        self.bodies = {n: [json.dumps(body).encode() for _, body in forms] for n, forms in self.wire.items()}
        self.samples: list[Sample] = [] if samples is None else samples  # filled as responses arrive
        self.to_check: list[tuple[Sample, str, dict[str, Any], bytes]] = []
        self.issued = 0

    async def one(self, due: float) -> None:
        endpoint = self.rng.choices(self.names, self.weights)[0]
        index = self.rng.randrange(len(self.pools[endpoint]))
        path, body = self.wire[endpoint][index][0], self.bodies[endpoint][index]
        self.issued += 1
        status, content = await self.send(path, body, f"loadgen-{self.config.seed}-{self.issued}")
        # perf_counter: uvloop's loop.time() ticks in ms
        sample = Sample(endpoint, status, time.perf_counter() - due, sent_at=due)
        self.samples.append(sample)
        if self.config.check_schema and status.startswith("2"):
            self.to_check.append((sample, endpoint, self.pools[endpoint][index], content))

    def check_schemas(self) -> None:
        protocol = self.config.protocol
        for sample, endpoint, payload, content in self.to_check:
            try:
                answer = from_wire(protocol, endpoint, json.loads(content))
                sample.schema_error = validate_response(endpoint, payload, answer)
            except json.JSONDecodeError:
                sample.schema_error = "response is not JSON"
            except (KeyError, IndexError, TypeError, ValueError) as e:
                sample.schema_error = f"unexpected {protocol} response: {e!r}"

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    async def open_loop(self) -> int:
        cfg = self.config
        total = math.inf if cfg.duration_s is None else math.ceil(cfg.duration_s * cfg.rate - 1e-9)
        total = min(total, cfg.max_requests or math.inf)  # arrivals at 0, 1/R, ... strictly before the end
        started = time.perf_counter()
        in_flight: set[asyncio.Task[None]] = set()
        dropped = arrivals = 0
        while arrivals < total and not self.stopped():
            due = started + arrivals / cfg.rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            arrivals += 1
            if len(in_flight) >= cfg.concurrency:
                dropped += 1
                continue
            task = asyncio.create_task(self.one(due))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        await asyncio.gather(*in_flight)
        return dropped

    async def measure(self) -> dict[str, Any]:
        started = time.perf_counter()
        dropped = await (self.open_loop() if self.config.rate else self.closed_loop())
        elapsed = time.perf_counter() - started
        self.check_schemas()
        return build_report(self.config, self.samples, elapsed, dropped)

    async def closed_loop(self) -> int:
        cfg, started = self.config, time.perf_counter()

        async def worker() -> None:
            while not self.stopped() and (cfg.max_requests is None or self.issued < cfg.max_requests):
                if cfg.duration_s is not None and time.perf_counter() - started >= cfg.duration_s:
                    return
                await self.one(time.perf_counter())

        await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
        return 0


async def run_load(
    config: LoadConfig,
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    stop: asyncio.Event | None = None,
    samples: list[Sample] | None = None,
) -> dict[str, Any]:
    """One load test's report; `transport` runs it in-process (httpx, the tests), `stop` ends it early,
    `samples` receives every request's Sample as its response arrives (to plot latency over time)."""
    config.validate()
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    if transport is None and config.client == "raw":  # benchmarks/rawhttp.py: keep-alive, lean
        host, port = rawhttp.host_port(config.url)
        pool, encoded = rawhttp.ConnectionPool(host, port), {}

        async def send(path: str, body: bytes, request_id: str) -> tuple[str, bytes]:
            raw = encoded.get(id(body))
            if raw is None:  # encoded once per payload: no per-request Python beyond the socket
                raw = encoded[id(body)] = rawhttp.encode_request(
                    "POST", path, body, headers, f"{host}:{port}"
                )
            try:
                response = await pool.request(raw, config.timeout_s)
            except asyncio.TimeoutError:
                return "timeout", b""
            except rawhttp.HTTPError:
                return "connection_error", b""
            return str(response.status), response.body

        try:
            return await _Runner(config, send, stop, samples).measure()
        finally:
            await pool.close()
    import httpx  # the tests' in-process transports, and --client httpx

    headers["Content-Type"] = "application/json"
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    async with httpx.AsyncClient(
        base_url=config.url, timeout=config.timeout_s, limits=limits, transport=transport
    ) as client:

        async def send(path: str, body: bytes, request_id: str) -> tuple[str, bytes]:
            try:
                response = await client.post(
                    path, content=body, headers={**headers, "X-Request-ID": request_id}
                )
            except httpx.TimeoutException:
                return "timeout", b""
            except httpx.HTTPError:
                return "connection_error", b""
            return str(response.status_code), response.content

        return await _Runner(config, send, stop, samples).measure()


def run_async(coroutine: Any) -> Any:
    """asyncio.run on uvloop when it is installed: the client's own CPU is taken from the server."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def run(config: LoadConfig, transport: httpx.AsyncBaseTransport | None = None) -> dict[str, Any]:
    return run_async(run_load(config, transport))


async def wait_ready(url: str, timeout_s: float, transport: httpx.AsyncBaseTransport | None = None) -> None:
    """Poll GET /ready until it answers 200; TimeoutError after timeout_s."""
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=5.0, transport=transport) as client:
        while True:
            try:
                if (await client.get("/ready")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}/ready did not answer 200 within {timeout_s:.0f}s")
            await asyncio.sleep(0.25)


def closed_loop_sweep(config: LoadConfig, levels: list[int]) -> list[dict[str, Any]]:
    """The benchmarks' table: one closed-loop run per concurrency level."""
    return [run(replace(config, rate=None, concurrency=level)) for level in levels]


def parse_args(argv: list[str] | None = None) -> tuple[LoadConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--url", default=DEFAULT_URL)
    add("--rate", type=float, help="requests/s, open loop; omit for closed loop")
    add("--duration", dest="duration_s", type=float, default=10.0, help="seconds (0 = until --max-requests)")
    add("--max-requests", type=int)
    add("--concurrency", type=int, help="closed loop: workers (8); open loop: in-flight cap (256)")
    add("--sweep", help="closed loop at each concurrency level, e.g. 1,8,32,64")
    add("--endpoints", default="all", help="'all', 'classify,qa' or 'classify=3,ner=1'")
    add("--timeout", dest="timeout_s", type=float, default=30.0)
    add("--seed", type=int, default=0)
    add("--api-key", help="sent as a Bearer token")
    add("--allow-remote", action="store_true", help="allow a non-loopback --url")
    add("--no-schema-check", dest="check_schema", action="store_false")
    add("--client", choices=("raw", "httpx"), default="raw", help="raw: lean HTTP/1.1; httpx: https")
    add("--protocol", choices=PROTOCOLS, default="ours", help="a peer's request shape")
    add("--wait-ready", type=float, default=0.0, help="first wait up to N s for GET /ready")
    add("--out", type=Path, help="write the JSON report here")
    args = p.parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if k in LoadConfig.__dataclass_fields__}
    fields |= {"url": args.url.rstrip("/"), "duration_s": args.duration_s or None}
    fields["concurrency"] = args.concurrency or (256 if args.rate else 8)
    try:
        config = LoadConfig(**fields | {"endpoints": parse_mix(args.endpoints)})
        config.validate()
        if args.sweep and args.rate:
            raise ValueError("--sweep is closed loop; drop --rate")
    except ValueError as e:
        p.error(str(e))
    return config, args


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    if args.wait_ready:
        run_async(wait_ready(config.url, args.wait_ready))
    sweep = [int(x) for x in args.sweep.split(",") if x.strip()] if args.sweep else []
    reports = closed_loop_sweep(config, sweep) if sweep else [run(config)]
    for report in reports:
        lat, cfg = report["latency_ms"], report["config"]
        print(
            f"{cfg['mode']}-loop c={cfg['concurrency']}: {report['requests']} requests, {report['ok']} ok, "
            f"{report['errors']} errors, {report['dropped']} dropped, "
            f"{report['throughput_rps']} req/s, p50 {lat['p50']} p95 {lat['p95']} p99 {lat['p99']} ms"
        )
        for name, ep in report["endpoints"].items():
            lat, errors = ep["latency_ms"], ep["errors_by_status"] or 0
            print(
                f"  {name:16} {ep['requests']:6} req  p50 {lat['p50']} p99 {lat['p99']} ms  errors {errors}"
            )
        if report["schema_error_examples"]:
            print("  schema errors, e.g.:", *report["schema_error_examples"], sep="\n    ")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        written = {"runs": reports} if sweep else reports[0]
        args.out.write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")
    return 0 if all(r["errors"] == 0 and r["dropped"] == 0 for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
