"""The transformers baseline server: our request/response shapes, same weights, a correct QA recipe."""

from __future__ import annotations

import random

import httpx
import pytest

from benchmarks import loadgen
from benchmarks.loadgen_payloads import make_payload, validate_response
from benchmarks.pipeline_server import (
    HFQuestionAnswering,
    QASettings,
    create_app,
    qa_settings_from_bundle,
)

QA = QASettings(max_seq_len=64, doc_stride=16, max_question_len=16, max_answer_len=10)


@pytest.fixture(scope="module")
def app(tiny_checkpoints):
    return create_app(
        tiny_checkpoints["classify"],
        tiny_checkpoints["qa"],
        classify_max_length=64,
        qa_settings=QA,
    )


async def post(app, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
        return await client.post(path, json=body)


async def test_endpoints_answer_with_our_response_shapes(app):
    rng = random.Random(1)
    for endpoint in ("classify", "qa"):
        for _ in range(3):
            payload = make_payload(endpoint, rng)
            response = await post(app, f"/{endpoint}", payload)
            assert response.status_code == 200, response.text
            assert validate_response(endpoint, payload, response.json()) is None


async def test_classify_batch_and_top_k(app):
    response = await post(
        app,
        "/classify",
        {"inputs": [{"text": "good movie"}, {"text": "bad", "text_pair": "film"}], "top_k": 1},
    )
    results = response.json()["results"]
    assert len(results) == 2 and all(len(r["scores"]) == 1 for r in results)
    full = (await post(app, "/classify", {"text": "good movie"})).json()
    assert [s["label"] for s in full["scores"]] != [] and abs(
        sum(s["score"] for s in full["scores"]) - 1
    ) < 1e-5
    assert full["label"] == results[0]["label"]


async def test_missing_model_is_404(tiny_checkpoints):
    only_classify = create_app(classify=tiny_checkpoints["classify"])
    response = await post(only_classify, "/qa", {"question": "who?", "context": "john smith"})
    assert response.status_code == 404


def test_needs_a_checkpoint():
    with pytest.raises(ValueError, match="at least one"):
        create_app()


async def test_loadgen_drives_it_in_process(app):
    config = loadgen.LoadConfig(
        duration_s=None, max_requests=24, concurrency=4, endpoints={"classify": 1, "qa": 1}
    )
    report = await loadgen.run_load(config, transport=httpx.ASGITransport(app=app))
    assert report["ok"] == 24 and report["errors"] == 0 and report["schema_errors"] == 0


async def test_classify_scores_match_our_onnx_bundle(app, tiny_bundles):
    """The baseline loads the very weights the bundle was exported from."""
    from app.engine.runtime import create_runtime
    from export.bundle import load_bundle_manifest
    from processing.padding import pad_batch, softmax
    from processing.tokenizer import TextTokenizer

    bundle = tiny_bundles["classify"]
    manifest = load_bundle_manifest(bundle)
    runtime = create_runtime(manifest.variant_path(bundle, "fp32"), "cpu", 1)
    text = "the film was great fun but the ending was bad"
    logits = runtime.run(pad_batch([TextTokenizer.from_dir(bundle).encode(text, max_length=64)]))["logits"][0]
    ours = dict(zip(manifest.labels or [], softmax(logits).tolist(), strict=True))
    theirs = {s["label"]: s["score"] for s in (await post(app, "/classify", {"text": text})).json()["scores"]}
    assert theirs.keys() == ours.keys()
    assert max(abs(theirs[k] - ours[k]) for k in ours) < 1e-4


def test_qa_recipe_finds_the_best_span_by_brute_force(tiny_checkpoints):
    import torch

    reader = HFQuestionAnswering(
        tiny_checkpoints["qa"], QASettings(max_seq_len=128, doc_stride=32, n_best=200, max_answer_len=5)
    )
    question, context = "where does john live ?", "john smith lives in paris . mary smith lives in london ."
    (best, *_), windows = reader(question, context, top_k=3)
    assert windows == 1
    encoded = reader.tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = encoded.pop("offset_mapping")[0].numpy()
    with torch.inference_mode():
        out = reader.model(**encoded)
    start, end = out.start_logits[0].numpy(), out.end_logits[0].numpy()
    in_context = [i for i, s in enumerate(encoded.sequence_ids(0)) if s == 1]
    spans = [(start[i] + end[j], i, j) for i in in_context for j in in_context if i <= j < i + 5]
    _, i, j = max(spans)
    assert (best["start"], best["end"]) == (int(offsets[i, 0]), int(offsets[j, 1]))
    assert best["text"] == context[best["start"] : best["end"]]


def test_qa_recipe_windows_top_k_and_no_answer(tiny_checkpoints):
    reader = HFQuestionAnswering(tiny_checkpoints["qa"], QA)
    context = " ".join(["john smith lives in paris ."] * 40)
    answers, windows = reader("where does john live ?", context, top_k=3)
    assert windows > 1
    assert len(answers) == 3
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    assert all(context[a["start"] : a["end"]] == a["text"] for a in answers)
    # Short context and a large top_k: every candidate comes back, so the scores are a full softmax.
    with_null, _ = reader("where ?", "john smith lives in paris .", top_k=1000, handle_impossible_answer=True)
    assert sum(a["text"] == "" and a["start"] == a["end"] == 0 for a in with_null) == 1
    assert abs(sum(a["score"] for a in with_null) - 1.0) < 1e-6


def test_qa_baseline_choice_and_bundle_settings(tiny_checkpoints, tiny_bundles):
    import transformers

    baseline = HFQuestionAnswering(tiny_checkpoints["qa"], QA)
    has_pipeline = transformers.__version__.split(".")[0] < "5"
    assert isinstance(baseline, HFQuestionAnswering) != has_pipeline
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(tiny_bundles["qa"])
    settings = qa_settings_from_bundle(tiny_bundles["qa"])
    assert settings.max_seq_len == manifest.max_seq_len == 64
    assert (settings.doc_stride, settings.max_question_len, settings.max_answer_len) == (
        manifest.qa_defaults["doc_stride"],
        manifest.qa_defaults["max_query_len"],
        manifest.qa_defaults["max_answer_len"],
    )
