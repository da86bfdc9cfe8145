"""benchmarks/breakdown: py-spy's raw samples into stages, and stage time per request."""

from __future__ import annotations

from benchmarks.breakdown import parse_raw, per_request_ms, stage_of

LOOP = "thread (7): MainThread;<module> (uvicorn/__main__.py:4);Runner.run (asyncio/runners.py:118)"
WORKER = "thread (9): infer-m_0;Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982)"


def test_each_sample_goes_to_its_innermost_named_stage():
    cycle = [
        "Runner.run (asyncio/runners.py:118)",
        "RequestResponseCycle.run_asgi (uvicorn/protocols/http/x.py:1)",
    ]
    assert stage_of(["<module> (x.py:1)", "Runner.run (asyncio/runners.py:118)"]) == "idle"
    assert (
        stage_of([*cycle, "classify (app/api/routes.py:9)", "encode (processing/tokenizer.py:3)"])
        == "tokenize"
    )
    assert stage_of([*cycle, "ClassifyService.__call__ (app/api/serving/services.py:9)"]) == "service glue"
    # The innermost frame a rule names wins: pydantic inside serialize_response is serializing.
    assert (
        stage_of([*cycle, "serialize_response (fastapi/routing.py:1)", "dump_json (pydantic/x.py:1)"])
        == "serialize"
    )
    assert (
        stage_of([*cycle, "OrtRuntime.run (app/engine/runtime.py:1)", "run (onnxruntime/x.py:2)"])
        == "ORT run"
    )
    assert (
        stage_of([*cycle, "RequestResponseCycle.send (uvicorn/protocols/http/httptools_impl.py:5)"])
        == "write"
    )
    assert stage_of([*cycle, "mystery (somewhere.py:1)"]) == "asyncio machinery"  # the loop's own frame
    assert stage_of(["<module> (x.py:1)", "mystery (somewhere.py:1)"]) == "other"
    # The log writer blocked in SimpleQueue.get (C) waits; formatting a record is logging work.
    writer = ["Thread.run (threading.py:982)", "LogWriter._run (app/observe/logs.py:90)"]
    assert stage_of(writer) == "idle"
    assert stage_of([*writer, "Handler.handle (logging/__init__.py:1)"]) == "metrics/logs"


def test_samples_become_thread_time_per_request():
    raw = "\n".join(
        [
            f"{LOOP} 150",  # idle
            f"{LOOP};run_asgi (uvicorn/protocols/http/x.py:1);encode (processing/tokenizer.py:3) 50",
            f"{WORKER};_worker (concurrent/futures/thread.py:1) 100",  # an idle worker
            f"{WORKER};Batcher._infer (app/engine/batcher.py:1);run (onnxruntime/x.py:2) 100",
        ]
    )
    samples = parse_raw(raw)
    assert samples["event loop"] == {"idle": 150, "tokenize": 50}
    assert samples["other threads"] == {"idle": 100, "ORT run": 100}
    # 200 loop samples in 2 s: 100 samples per thread-second; 10 requests served.
    ms = per_request_ms(samples, duration_s=2.0, requests=10)
    assert ms["event loop"] == {"tokenize": 50.0, "idle": 150.0}
    assert ms["other threads"]["ORT run"] == 100.0
    assert per_request_ms(samples, duration_s=2.0, requests=0) == {}
