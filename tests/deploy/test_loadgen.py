"""benchmarks/loadgen.py in-process, against a fake service behind httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import httpx
import pytest

from benchmarks import loadgen
from benchmarks.loadgen_payloads import ENDPOINTS, make_payload, validate_response


def good_response(endpoint: str, body: dict) -> dict:
    """What a correct service could answer (spans cut from the request's own text)."""
    if endpoint == "classify":
        return {
            "label": "positive",
            "score": 0.9,
            "scores": [{"label": "negative", "score": 0.1}, {"label": "positive", "score": 0.9}],
        }
    if endpoint == "ner":
        word = body["text"].split()[0]
        return {"entities": [{"entity": "PER", "text": word, "start": 0, "end": len(word), "score": 0.8}]}
    if endpoint == "multiple-choice":
        n = len(body["choices"])
        return {"best": n - 1, "choice": body["choices"][-1], "scores": [0.0] * (n - 1) + [1.0]}
    start = body["context"].index(" ") + 1
    end = body["context"].index(" ", start)
    answer = {"text": body["context"][start:end], "start": start, "end": end, "score": 0.5}
    return {"answers": [answer] * min(2, body.get("top_k", 2))}


class FakeService:
    """Answers like the real service; `faults` maps an endpoint to a status code or a bad body."""

    def __init__(self, delay_s: float = 0.0, faults: dict | None = None):
        self.delay_s, self.faults = delay_s, faults or {}
        self.in_flight = self.max_in_flight = 0
        self.paths: Counter[str] = Counter()
        self.request_ids: set[str] = set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            endpoint = request.url.path.lstrip("/")
            self.paths[endpoint] += 1
            self.request_ids.add(request.headers["x-request-id"])
            fault = self.faults.get(endpoint)
            if isinstance(fault, int):
                return httpx.Response(fault, json={"detail": "injected"})
            if fault is not None:
                return httpx.Response(200, json=fault)
            return httpx.Response(200, json=good_response(endpoint, json.loads(request.content)))
        finally:
            self.in_flight -= 1


def config(**overrides) -> loadgen.LoadConfig:
    return loadgen.LoadConfig(**{"duration_s": None, "max_requests": 40, "concurrency": 4, **overrides})


async def run_fake(service: FakeService, **overrides) -> dict:
    return await loadgen.run_load(config(**overrides), transport=httpx.MockTransport(service))


async def test_closed_loop_is_bounded_and_clean():
    service = FakeService(delay_s=0.001)
    report = await run_fake(service, max_requests=60, concurrency=4)
    assert report["requests"] == report["ok"] == 60 == sum(service.paths.values())
    assert report["errors"] == report["schema_errors"] == report["dropped"] == 0
    assert report["errors_by_status"] == {} and report["status_codes"] == {"200": 60}
    assert set(service.paths) == set(ENDPOINTS)
    assert sum(ep["requests"] for ep in report["endpoints"].values()) == 60
    assert len(service.request_ids) == 60, "every request carries its own X-Request-ID"
    assert service.max_in_flight <= 4
    lat = report["latency_ms"]
    assert 1.0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert report["throughput_rps"] > 0 and report["config"]["mode"] == "closed"


@pytest.mark.parametrize(("rate", "duration_s", "arrivals"), [(10.0, 0.3, 3), (7.0, 0.3, 3), (3.0, 1.0, 3)])
async def test_open_loop_arrivals_fall_strictly_inside_the_duration(rate, duration_s, arrivals):
    report = await run_fake(FakeService(), rate=rate, duration_s=duration_s, max_requests=None)
    assert report["requests"] + report["dropped"] == arrivals


async def test_open_loop_keeps_the_arrival_rate():
    service = FakeService()
    report = await run_fake(service, rate=100.0, duration_s=0.5, max_requests=None, concurrency=16)
    # Arrivals are due at 0, 10, ..., 490 ms whatever the responses do.
    assert report["requests"] == 50 and report["dropped"] == 0
    assert 0.45 <= report["elapsed_s"] < 2.0
    assert report["config"]["mode"] == "open"


async def test_open_loop_drops_above_the_concurrency_cap():
    service = FakeService(delay_s=0.2)
    report = await run_fake(service, rate=100.0, duration_s=0.3, max_requests=None, concurrency=2)
    assert service.max_in_flight <= 2
    assert report["dropped"] > 0 and report["requests"] + report["dropped"] == 30
    # Latency counts from the due time, so it is at least the service time.
    assert report["latency_ms"]["p50"] >= 200


async def test_open_loop_honours_max_requests():
    report = await run_fake(FakeService(), rate=200.0, duration_s=5.0, max_requests=7)
    assert report["requests"] == 7 and report["elapsed_s"] < 1.0


async def test_errors_are_counted_by_status_and_endpoint():
    service = FakeService(faults={"ner": 503, "qa": 429})
    report = await run_fake(service, max_requests=80)
    ner, qa = report["endpoints"]["ner"], report["endpoints"]["qa"]
    assert ner["requests"] > 0 and ner["errors_by_status"] == {"503": ner["requests"]} and ner["ok"] == 0
    assert qa["errors_by_status"] == {"429": qa["requests"]}
    assert report["errors_by_status"] == {"429": qa["requests"], "503": ner["requests"]}
    assert report["errors"] == ner["requests"] + qa["requests"]
    assert report["endpoints"]["classify"]["errors"] == 0


async def test_schema_violations_are_errors():
    service = FakeService(faults={"multiple-choice": {"best": 0}})
    report = await run_fake(service, max_requests=40, endpoints={"multiple-choice": 1.0})
    assert report["schema_errors"] == report["errors"] == 40 and report["ok"] == 0
    assert report["schema_error_examples"]


async def test_transport_errors_are_reported():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    report = await loadgen.run_load(config(max_requests=5), transport=httpx.MockTransport(refuse))
    assert report["errors_by_status"] == {"connection_error": 5}


async def test_endpoint_mix_is_weighted():
    service = FakeService()
    await run_fake(service, max_requests=400, endpoints={"classify": 3.0, "qa": 1.0}, concurrency=8)
    assert set(service.paths) == {"classify", "qa"}
    assert 2.0 < service.paths["classify"] / service.paths["qa"] < 4.5


async def test_wait_ready():
    calls = []

    def ready_after_two(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(200 if len(calls) > 2 else 503)

    await loadgen.wait_ready("http://127.0.0.1:1", 5.0, transport=httpx.MockTransport(ready_after_two))
    assert calls == ["/ready"] * 3
    with pytest.raises(TimeoutError):
        await loadgen.wait_ready(
            "http://127.0.0.1:1", 0.3, transport=httpx.MockTransport(lambda r: httpx.Response(503))
        )


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://localhost", "http://[::1]:80", "http://127.3.4.5"]
)
def test_loopback_targets_are_allowed(url):
    loadgen.check_target(url)


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "http://example.com", "https://api.internal"])
def test_remote_targets_need_allow_remote(url):
    with pytest.raises(ValueError, match="--allow-remote"):
        loadgen.check_target(url)
    loadgen.check_target(url, allow_remote=True)


def test_cli_refuses_remote_and_unbounded_runs(capsys):
    for argv in (
        ["--url", "http://example.com"],
        ["--duration", "0"],
        ["--endpoints", "sentiment"],
        ["--rate", "-1"],
        ["--sweep", "1,8", "--rate", "5"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            loadgen.parse_args(argv)
        assert exit_info.value.code == 2, argv
    config, _ = loadgen.parse_args(["--rate", "20", "--endpoints", "classify=2,ner"])
    assert (
        config.rate == 20 and config.endpoints == {"classify": 2.0, "ner": 1.0} and config.concurrency == 256
    )
    config, _ = loadgen.parse_args(["--max-requests", "10", "--duration", "0"])
    assert config.rate is None and config.concurrency == 8 and config.duration_s is None


def test_parse_mix():
    assert loadgen.parse_mix("all") == dict.fromkeys(ENDPOINTS, 1.0)
    assert loadgen.parse_mix("qa, ner=0.5") == {"qa": 1.0, "ner": 0.5}
    for bad in ("", "qa=x", "qa=-1", "classify=0", "squad"):
        with pytest.raises(ValueError):
            loadgen.parse_mix(bad)


def test_percentiles():
    stats = loadgen.percentiles([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert stats["p50"] == pytest.approx(50.5) and stats["p99"] == pytest.approx(99.01)
    assert stats["max"] == 100.0 and stats["mean"] == pytest.approx(50.5)
    assert loadgen.percentiles([])["p50"] is None


def test_payloads_are_deterministic_and_varied():
    for endpoint in ENDPOINTS:
        a = [make_payload(endpoint, random.Random(1)) for _ in range(3)]
        assert a[0] == a[1] == a[2]
    rng = random.Random(0)
    classify_words = [len(make_payload("classify", rng)["text"].split()) for _ in range(200)]
    assert min(classify_words) < 20 and max(classify_words) > 200, "short and long texts"
    contexts = [make_payload("qa", rng)["context"] for _ in range(100)]
    assert max(len(c.split()) for c in contexts) > 1000, "long QA contexts"
    for _ in range(100):
        body = make_payload("multiple-choice", rng)
        assert 2 <= len(body["choices"]) == len(set(body["choices"]))


def test_validate_response_accepts_good_and_names_bad():
    rng = random.Random(0)
    for endpoint in ENDPOINTS:
        body = make_payload(endpoint, rng)
        assert validate_response(endpoint, body, good_response(endpoint, body)) is None
    ner = {"text": "Mary lives in Paris"}
    shifted = {"entities": [{"entity": "PER", "text": "Mary", "start": 1, "end": 5, "score": 0.9}]}
    assert "source[1:5]" in validate_response("ner", ner, shifted)
    qa = {"question": "q", "context": "abc def", "top_k": 1}
    two = {"answers": [{"text": "abc", "start": 0, "end": 3, "score": 1.0}] * 2}
    assert "top_k=1" in validate_response("qa", qa, two)
    mc = {"context": "c", "choices": ["a", "b"]}
    assert "choices[1]" in validate_response(
        "multiple-choice", mc, {"best": 1, "choice": "a", "scores": [0, 1]}
    )
    assert "scores" in validate_response("multiple-choice", mc, {"best": 1, "choice": "b", "scores": [1]})
    bad_label = {"label": "x", "score": 1.0, "scores": [{"label": "y", "score": 1.0}]}
    assert "not among" in validate_response("classify", {"text": "t"}, bad_label)
    assert "score" in validate_response(
        "classify", {"text": "t"}, {"label": "y", "score": True, "scores": []}
    )
    assert validate_response("qa", qa, ["not", "an", "object"]) == "body is list, not an object"
