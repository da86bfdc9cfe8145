"""Startup, readiness, damaged bundles, configuration errors, shutdown, settings and logs."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import threading

import httpx
import pytest
from pydantic import ValidationError

from app.engine import loader
from app.engine.heap import YOUNG_OBJECTS
from app.engine.registry import ConfigError
from app.main import ServiceState, _hook_termination, create_app
from app.observe.logs import flush_logs
from app.settings import Settings
from tests.app.conftest import bundle_of, serving, wait_ready


async def test_ready_only_after_load_and_warm_up(models_dir, monkeypatch):
    release = threading.Event()
    original = loader.warm_up

    def slow_warm_up(*args):
        assert release.wait(20)
        original(*args)

    monkeypatch.setattr(loader, "warm_up", slow_warm_up)
    async with serving(models_dir, ready=False) as (_, client):
        r = await client.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert (await client.get("/health")).status_code == 200  # alive while loading
        loading = await client.post("/classify", json={"text": "good"})
        assert loading.status_code == 503 and loading.json()["error"] == "model_loading"
        assert loading.headers["retry-after"]
        release.set()
        r = await wait_ready(client)
        assert r.status_code == 200 and r.json()["ready"] is True
        assert set(r.json()["models"].values()) == {"ready"}
        assert (await client.post("/classify", json={"text": "good"})).status_code == 200


def damage(bundle_dir, how: str) -> str:
    """Break one bundle; returns a phrase the error must contain."""
    model = bundle_dir / "model_int8_rowwise.onnx"
    if how == "tampered":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0xFF
        model.write_bytes(bytes(data))
        return "sha256"
    if how == "truncated":
        model.write_bytes(model.read_bytes()[:1000])
        return "truncated"
    if how == "missing_model":
        model.unlink()
        return "missing"
    if how == "missing_tokenizer":
        (bundle_dir / "vocab.txt").unlink()
        return "missing"
    if how == "bad_manifest":
        (bundle_dir / "bundle.json").write_text("{not json", encoding="utf-8")
        return "not valid JSON"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["tampered", "truncated", "missing_model", "missing_tokenizer", "bad_manifest"]
)
async def test_damaged_bundle_is_never_served(make_models_dir, how, caplog):
    models = make_models_dir(("classify", "qa"))
    phrase = damage(models / "qa", how)
    caplog.set_level(logging.ERROR, logger="app")
    async with serving(models, ready=False) as (_, client):
        r = await wait_ready(client)
        await asyncio.sleep(0.05)
        r = await client.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "failed"
        assert phrase in r.json()["errors"]["qa"]
        qa = await client.post("/qa", json={"question": "who?", "context": "john"})
        assert qa.status_code in (404, 503) and qa.json()["error"] in ("model_unavailable", "no_model")
        assert (await client.post("/classify", json={"text": "good"})).status_code == 200
        models_info = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
        assert models_info["qa"]["status"] == "failed" and phrase in models_info["qa"]["error"]
    lines = [r for r in caplog.records if r.getMessage() == "bundle failed to load and will not be served"]
    assert len(lines) == 1 and phrase in lines[0].error and lines[0].bundle == "qa"


async def test_a_variant_that_breaks_its_batch_invariance_promise_is_not_served(models_dir, monkeypatch):
    # As if this machine's kernels made int8 (dynamic, batch-dependent) claim invariance: warm-up
    # compares a short row alone and padded next to the longest one, and refuses the bundle.
    import export.bundle

    monkeypatch.setitem(export.bundle.BATCH_INVARIANT, "int8", True)
    async with serving(models_dir, ready=False, cpu_variant="int8") as (_, client):
        await wait_ready(client)
        r = await client.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "failed"
        assert "should give a row the same outputs alone and in a batch" in r.json()["errors"]["qa"]


async def expect_config_error(models_dir, match: str, **overrides) -> None:
    app = create_app(Settings(models_dir=models_dir, log_level="WARNING", **overrides))
    with pytest.raises(ConfigError, match=match):
        async with app.router.lifespan_context(app):
            pass


async def test_default_bundles_must_name_a_model_of_the_task(make_models_dir, tmp_path):
    two = make_models_dir({"sst2": "classify", "imdb": "classify", "conll": "ner"})
    await expect_config_error(
        two,
        r"'nope' for classify, but the classify models in MODELS_DIR are \['imdb', 'sst2'\]",
        default_bundles="classify=nope",
    )
    await expect_config_error(two, "'conll' for classify", default_bundles="classify=conll")
    # The manifest name works as well as the directory name (as before models had names).
    async with serving(two, default_bundles="classify=tiny-classify,ner=conll") as (app, _):
        assert bundle_of(app, "classify").name == "imdb"
    await expect_config_error(tmp_path / "absent", "not a directory")
    (tmp_path / "empty").mkdir()
    await expect_config_error(tmp_path / "empty", "no bundles")


async def test_device_cuda_refused_without_cuda(models_dir, monkeypatch):
    monkeypatch.setattr("app.engine.registry.available_providers", lambda: ["CPUExecutionProvider"])
    await expect_config_error(models_dir, "DEVICE=cuda", device="cuda")


async def test_cuda_session_that_falls_back_fails_the_bundle(make_models_dir, monkeypatch):
    """ORT can drop CUDA silently; the bundle must then fail, never serve on CPU."""
    import app.engine.registry as registry_module
    from app.engine import runtime as runtime_module

    monkeypatch.setattr(
        registry_module, "available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    real_create = runtime_module.create_runtime

    def cpu_only_session(path, device, threads, spinning=True, session_factory=None, **kwargs):
        import onnxruntime as ort

        def factory(p, sess_options=None, providers=None):
            return ort.InferenceSession(p, sess_options=sess_options, providers=["CPUExecutionProvider"])

        return real_create(path, device, threads, spinning, session_factory=factory, **kwargs)

    monkeypatch.setattr(loader, "create_runtime", cpu_only_session)
    async with serving(make_models_dir(("classify",)), ready=False, device="cuda") as (_, client):
        r = await wait_ready(client)
        assert r.status_code == 503 and "Refusing to fall back" in r.json()["errors"]["classify"]
        assert (await client.post("/classify", json={"text": "good"})).status_code == 503


async def test_loaded_heap_is_settled_and_released_at_shutdown(models_dir):
    gc.unfreeze()
    async with serving(models_dir, ready=False) as (app, client):
        assert (await wait_ready(client)).status_code == 200
        while not app.state.service_state.registry.load_finished:
            await asyncio.sleep(0.01)
        assert gc.get_freeze_count() > 10_000  # the app, its schemas and the models' Python side
        assert gc.get_threshold()[0] == YOUNG_OBJECTS
    assert gc.get_freeze_count() == 0  # collectable again once the app is gone


async def test_shutdown_turns_readiness_off_and_finishes_in_flight(models_dir):
    app = create_app(Settings(models_dir=models_dir, log_level="WARNING", max_wait_ms=0))
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        assert (await wait_ready(client)).status_code == 200
        batcher = bundle_of(app, "classify").batcher
        inner, gate, entered = batcher.runtime, threading.Event(), threading.Event()

        class Gated:
            def run(self, inputs):
                entered.set()
                assert gate.wait(20)
                return inner.run(inputs)

        batcher.runtime = Gated()
        batcher.inline_tokens = 0  # held in a worker thread, so the event loop keeps answering
        in_flight = asyncio.create_task(client.post("/classify", json={"text": "still served"}))
        while not entered.is_set():
            await asyncio.sleep(0.005)
        closing = asyncio.create_task(lifespan.__aexit__(None, None, None))
        await asyncio.sleep(0.05)
        ready = await client.get("/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "shutting_down"
        assert not closing.done()  # waiting for the in-flight request
        gate.set()
        response = await in_flight
        assert response.status_code == 200 and response.json()["label"]
        await asyncio.wait_for(closing, 10)
        after = await client.post("/classify", json={"text": "too late"})
        assert after.status_code == 503 and after.json()["error"] == "shutting_down"


def test_sigterm_turns_readiness_off_then_calls_the_server_handler():
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        state = ServiceState(settings=None, metrics=None, registry=None, in_flight=None, admission=None)  # type: ignore[arg-type]
        restore = _hook_termination(state)
        os.kill(os.getpid(), signal.SIGTERM)
        assert state.shutting_down and calls == [signal.SIGTERM]
        restore()
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == [signal.SIGTERM, signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_settings_from_environment(monkeypatch, tmp_path):
    env = {
        "MODELS_DIR": str(tmp_path),
        "DEVICE": "cpu",
        "CPU_VARIANT": "fused",
        "INTRA_OP_THREADS": "3",
        "MAX_BATCH_SIZE": "8",
        "MAX_BATCH_TOKENS": "4096",
        "MAX_WAIT_MS": "2.5",
        "MAX_QUEUE": "100",
        "MAX_BODY_BYTES": "65536",
        "MAX_TEXT_CHARS": "500",
        "MAX_QA_CONTEXT_CHARS": "9000",
        "MAX_BATCH_ITEMS": "10",
        "MAX_CHOICES": "5",
        "API_KEY": "s3cr3t-key",
        "CORS_ORIGINS": "https://a.io, https://b.io",
        "LOG_LEVEL": "debug",
        "DEFAULT_BUNDLES": "qa=squad, ner=conll",
        "CLASSIFY_LONG_TEXT": "windows",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = Settings()
    assert s.models_dir == tmp_path and s.device == "cpu" and s.cpu_variant == "fused"
    assert (s.intra_op_threads, s.max_batch_size, s.max_batch_tokens, s.max_wait_ms) == (3, 8, 4096, 2.5)
    assert (s.max_queue, s.max_body_bytes, s.max_text_chars, s.max_qa_context_chars) == (
        100,
        65536,
        500,
        9000,
    )
    assert (s.max_batch_items, s.max_choices, s.classify_long_text, s.log_level) == (
        10,
        5,
        "windows",
        "DEBUG",
    )
    assert s.api_key is not None and s.api_key.get_secret_value() == "s3cr3t-key" and "s3cr3t" not in repr(s)
    assert s.cors_origin_list == ["https://a.io", "https://b.io"]
    assert s.default_bundle_map == {"qa": "squad", "ner": "conll"}
    monkeypatch.setenv("API_KEY", "")
    assert Settings().api_key is None


@pytest.mark.parametrize(
    "key, value",
    [
        ("DEVICE", "tpu"),
        ("CPU_VARIANT", "int4"),
        ("DEFAULT_BUNDLES", "qa"),
        ("DEFAULT_BUNDLES", "speech=x"),
        ("MAX_BATCH_SIZE", "0"),
        ("LOG_LEVEL", "loud"),
        ("CLASSIFY_LONG_TEXT", "chop"),
    ],
)
def test_bad_settings_are_refused(monkeypatch, key, value):
    monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError):
        Settings()


async def test_json_logs_carry_the_request_id(models_dir, capsys):
    async with serving(models_dir, log_level="INFO") as (_, client):
        capsys.readouterr()
        await client.post("/classify", json={"text": "good"}, headers={"x-request-id": "log-test-1"})
        assert flush_logs()
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    access = [x for x in lines if x.get("request_id") == "log-test-1" and x["message"] == "request"]
    assert len(access) == 1
    assert access[0]["status"] == 200 and access[0]["path"] == "/classify" and access[0]["duration_ms"] > 0
    assert access[0]["level"] == "INFO" and access[0]["logger"] == "app.access"
