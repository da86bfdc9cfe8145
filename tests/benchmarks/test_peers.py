"""service_bench's peers, the parts that need none installed: protocols, answers, report, environments."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from benchmarks import loadgen, peer_envs, service_bench, service_report
from benchmarks.loadgen_payloads import from_wire, make_payload, to_wire, validate_response


def infinity(request: httpx.Request) -> httpx.Response:
    """Infinity's /embeddings: OpenAI's shape, items possibly out of order."""
    texts = json.loads(request.content)["input"]
    data = [
        {"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(texts)
    ]
    return httpx.Response(200, json={"object": "list", "data": data[::-1]})


def mlserver(request: httpx.Request) -> httpx.Response:
    """mlserver-huggingface over V2: the pipeline's answer as one JSON text."""
    assert request.url.path == "/v2/models/peer/infer"
    answer = json.dumps({"label": "POSITIVE", "score": 0.9})
    return httpx.Response(200, json={"outputs": [{"name": "output", "datatype": "BYTES", "data": [answer]}]})


@pytest.mark.parametrize(
    "protocol, endpoint, service", [("openai", "embed-32", infinity), ("v2", "classify-25w", mlserver)]
)
async def test_loadgen_speaks_each_peers_protocol(protocol, endpoint, service):
    config = loadgen.LoadConfig(
        duration_s=None, max_requests=12, concurrency=2, endpoints={endpoint: 1.0}, protocol=protocol
    )
    report = await loadgen.run_load(config, transport=httpx.MockTransport(service))
    assert report["ok"] == report["requests"] == 12 and report["schema_errors"] == 0


async def test_a_wrong_answer_in_a_peers_protocol_is_a_schema_error():
    def short(request: httpx.Request) -> httpx.Response:  # one vector for 32 texts
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0]}]})

    config = loadgen.LoadConfig(
        duration_s=None, max_requests=4, concurrency=1, endpoints={"embed-32": 1.0}, protocol="openai"
    )
    report = await loadgen.run_load(config, transport=httpx.MockTransport(short))
    assert report["ok"] == 0 and report["schema_errors"] == 4


def test_wire_forms_keep_order_and_schema():
    payload = make_payload("embed-32", random.Random(0))
    path, body = to_wire("openai", "embed-32", payload)
    assert path == "/embeddings" and body["input"] == payload["inputs"] and len(body["input"]) == 32
    vectors = from_wire("openai", "embed", infinity(httpx.Request("POST", path, json=body)).json())
    assert [v[0] for v in vectors] == [float(len(t)) for t in payload["inputs"]]
    assert validate_response("embed-32", payload, vectors) is None
    assert to_wire("ours", "classify-25w", {"text": "x"}) == ("/classify", {"text": "x"})
    with pytest.raises(ValueError):
        to_wire("v2", "embed", {"inputs": "x"})


def test_compare_flags_disagreement():
    same = service_bench.compare("embed", [[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.01], [0.0, 3.0]])
    assert same["agrees"] and same["cosine_min"] > 0.99
    assert not service_bench.compare("embed", [[1.0, 0.0]], [[0.0, 1.0]])["agrees"]
    labels = service_bench.compare(
        "classify", [("positive", 0.9), ("negative", 0.8)], [("positive", 0.88), ("positive", 0.6)]
    )
    assert labels["labels_agree"] == 0.5 and not labels["agrees"]
    assert service_bench.compare("classify", [("positive", 0.9)], [("positive", 0.86)])["agrees"]


def test_report_shows_ratios_to_the_fastest_real_peer_and_who_could_not_run(tmp_path):
    def server(*rates: float) -> dict:
        levels = [
            {
                "workload": w,
                "concurrency": c,
                "throughput_rps": r,
                "throughput_rps_by_round": [r, r + 10],
                "latency_ms": {"p50": 1000 / r, "p99": 2000 / r},
                "errors": 0,
                "cpu_ms_per_request": {"main_thread": 1.0, "other_threads": 2.0, "load_generator": 0.1},
            }
            for (w, c), r in zip([("embed", 1), ("embed", 32), ("embed-32", 4)], rates, strict=True)
        ]
        return {"levels": levels, "answers": {"cosine_min": 0.999, "agrees": True}}

    entry = {
        "bundle": "b",
        "servers": {
            "ours": server(200, 300, 30),
            "fastembed": server(100, 150, 20),
            "st": server(900, 900, 900),  # a floor: never "the fastest peer"
            "infinity-optimum": {"error": "ImportError: no optimum.onnxruntime\nmore"},
        },
    }
    entry["targets"] = service_report.targets(entry)
    assert service_report.fastest_peer(entry, "embed c=1") == ("fastembed", 100)
    assert entry["targets"]["embed c=32 vs fastest peer"]["passed"]  # 2.0 >= 1.5
    assert entry["targets"]["embed-32 c=4 vs fastest peer"]["ratio"] == 1.5
    report = {
        "created_at": "now",
        "machine": {"cpu": "test"},
        "settings": {"command": "python -m benchmarks.service_bench", "duration": 1, "warmup": 0, "rounds": 2}
        | {"variant": "int8-rowwise"},
        "servers": {name: "x" for name in entry["servers"]},
        "versions": {},
        "endpoints": {"embed": entry},
    }
    text = service_report.markdown(report)
    assert "| ours | embed c=1 | 200.0 (200.0–210.0) | 2.00 |" in text
    assert "| fastembed | embed-32 c=4 | 20.0 (20.0–30.0) | 1.00 |" in text
    assert "**infinity-optimum** (/embed): ImportError: no optimum.onnxruntime … more" in text
    service_report.plot(report, tmp_path / "peers.png")
    assert (tmp_path / "peers.png").stat().st_size > 0


def test_an_environment_is_reused_only_for_the_same_list(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_envs, "PEERS_DIR", tmp_path)
    calls = []

    def run(argv, **_):
        calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            (tmp_path / "fastembed" / "venv").mkdir(parents=True)
        return _Done()

    monkeypatch.setattr(peer_envs.subprocess, "run", run)
    python = peer_envs.ensure("fastembed")
    assert calls[0][1:3] == ["-m", "venv"] and any("fastembed" in argv for argv in calls[1])
    assert not any(peer_envs.TORCH in argv for argv in calls)  # fastembed needs no torch
    calls.clear()
    assert peer_envs.ensure("fastembed") == python and calls == []
    (tmp_path / "fastembed" / "venv" / "requirements.txt").write_text("other\n")
    peer_envs.ensure("fastembed")
    assert calls, "a different list rebuilds the environment"


class _Done:
    returncode, stdout, stderr = 0, "", ""
