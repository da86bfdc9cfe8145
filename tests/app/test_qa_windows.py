"""QA over many windows, with answers placed where we choose.

A random tiny model cannot be steered to an answer, so the QA bundle's ONNX session is
swapped for `MarkerRuntime`, which scores context tokens by identity: "paris" is the best
start, "france" the best end. Everything else is the real service: tokenization, windows,
batching across requests, merging of window candidates and character offsets. Where the
answer sits relative to the windows is checked with processing.qa itself, not assumed.
"""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
import pytest_asyncio

from processing import qa as qa_proc
from tests.app.conftest import bundle_of, serving

QUESTION = "where?"
ANSWER = ["paris", "in", "france"]
FILLER = ["the", "a", "cat", "dog", "ran", "sat", "mat", "house", "river", "city"]


class MarkerRuntime:
    def __init__(self, vocab: dict[str, int], null_logit: float = -5.0):
        self.start_id, self.end_id = vocab["paris"], vocab["france"]
        self.null_logit = null_logit
        self.batches: list[int] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, types = inputs["input_ids"], inputs["token_type_ids"]
        self.batches.append(len(ids))
        context = types == 1
        start = np.where(context & (ids == self.start_id), 8.0, 0.0).astype(np.float32)
        end = np.where(context & (ids == self.end_id), 8.0, 0.0).astype(np.float32)
        start[:, 0] = end[:, 0] = self.null_logit  # [CLS] carries the "no answer" score
        return {"start_logits": start, "end_logits": end}


def context_with_answer(n_tokens: int, answer_at: int | None) -> str:
    words = [FILLER[i % len(FILLER)] for i in range(n_tokens)]
    if answer_at is not None:
        words[answer_at : answer_at + len(ANSWER)] = ANSWER
    return " ".join(words)


def windows_holding(bundle, context: str, first: int, last: int, doc_stride: int) -> tuple[list[int], object]:
    """Indices of the windows that contain tokens first..last, computed by processing.qa."""
    qa_input = qa_proc.make_windows(
        bundle.tokenizer,
        QUESTION,
        context,
        bundle.manifest.max_seq_len,
        doc_stride,
        bundle.manifest.qa_defaults["max_query_len"],
    )
    assert len(qa_input.context_tokens) == len(context.split()), "filler must be one token per word"
    return [
        n
        for n, w in enumerate(qa_input.windows)
        if w.token_start <= first and last < w.token_start + w.n_context
    ], qa_input


async def ask(client, context: str, **extra) -> dict:
    r = await client.post("/qa", json={"question": QUESTION, "context": context, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def expected_span(context: str) -> tuple[int, int]:
    start = context.index("paris in france")
    return start, start + len("paris in france")


@pytest.fixture(scope="module")
def qa_models(app_bundles, tmp_path_factory):
    """A MODELS_DIR of the QA bundle alone: the only model these tests ask."""
    root = tmp_path_factory.mktemp("qa-models")
    shutil.copytree(app_bundles["qa"], root / "qa")
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def qa_app(qa_models):
    """One app for the tests at the default settings; each installs its own MarkerRuntime."""
    async with serving(qa_models) as pair:
        yield pair


async def install_marker(app, **kwargs) -> MarkerRuntime:
    bundle = bundle_of(app, "qa")
    runtime = MarkerRuntime(bundle.tokenizer.tokenizer.get_vocab(), **kwargs)
    bundle.batcher.runtime = runtime
    return runtime


async def test_answer_only_in_the_third_window(qa_app):
    app, client = qa_app
    await install_marker(app)
    bundle = bundle_of(app, "qa")
    stride = bundle.service.doc_stride
    context = context_with_answer(160, answer_at=100)
    holding, qa_input = windows_holding(bundle, context, 100, 102, stride)
    assert holding == [2], f"setup: the answer should be in the third window only, got {holding}"
    out = await ask(client, context)
    assert out["windows"] == len(qa_input.windows) >= 3
    best = out["answers"][0]
    assert (best["start"], best["end"]) == expected_span(context)
    assert best["text"] == "paris in france" == context[best["start"] : best["end"]]


async def test_answer_straddling_a_window_edge(qa_app):
    app, client = qa_app
    await install_marker(app)
    bundle = bundle_of(app, "qa")
    stride = bundle.service.doc_stride
    probe = windows_holding(bundle, context_with_answer(160, None), 0, 0, stride)[1]
    edge = probe.windows[0].n_context  # first token after window 0
    answer_at = edge - 1  # "paris" is window 0's last token, "in france" lies beyond it
    context = context_with_answer(160, answer_at)
    holding, _ = windows_holding(bundle, context, answer_at, answer_at + 2, stride)
    assert 0 not in holding and holding, f"setup: the answer must cross window 0's end, got {holding}"
    out = await ask(client, context)
    best = out["answers"][0]
    assert (best["start"], best["end"]) == expected_span(context) and best["text"] == "paris in france"


async def test_context_twenty_windows_long(qa_app):
    app, client = qa_app
    await install_marker(app)
    bundle = bundle_of(app, "qa")
    capacity = qa_proc.window_capacity(bundle.manifest.max_seq_len, 2)
    n_tokens = 20 * capacity
    for answer_at in (n_tokens - 5, n_tokens // 2, 3):
        context = context_with_answer(n_tokens, answer_at)
        out = await ask(client, context, top_k=2)
        assert out["windows"] >= 20
        best = out["answers"][0]
        assert (best["start"], best["end"]) == expected_span(context)
        assert best["score"] > out["answers"][1]["score"]


async def test_impossible_answer(qa_app):
    app, client = qa_app
    await install_marker(app, null_logit=30.0)
    context = context_with_answer(120, answer_at=None)  # no marker anywhere
    out = await ask(client, context, handle_impossible_answer=True)
    assert out["answers"][0] == {"text": "", "start": 0, "end": 0, "score": out["answers"][0]["score"]}
    assert out["answers"][0]["score"] > 0.9
    forced = await ask(client, context)  # without the flag an answer is always a span
    assert forced["answers"][0]["text"] != ""


async def test_max_answer_len_counts_tokens(qa_app):
    app, client = qa_app
    await install_marker(app)
    context = context_with_answer(40, answer_at=10)
    assert (await ask(client, context, max_answer_len=3))["answers"][0]["text"] == "paris in france"
    assert (await ask(client, context, max_answer_len=2))["answers"][0]["text"] != "paris in france"


async def test_concurrent_requests_share_batches_and_keep_their_answers(qa_models):
    async with serving(qa_models, max_wait_ms=30) as (app, client):
        runtime = await install_marker(app)
        contexts = [context_with_answer(150, answer_at=7 + 11 * n) for n in range(8)]
        alone = [await ask(client, c) for c in contexts]
        runtime.batches.clear()
        together = await asyncio.gather(*(ask(client, c) for c in contexts))
        for context, one, both in zip(contexts, alone, together, strict=True):
            assert both == one
            assert (both["answers"][0]["start"], both["answers"][0]["end"]) == expected_span(context)
        windows_per_request = together[0]["windows"]
        # Windows from different requests were batched together.
        assert max(runtime.batches) > windows_per_request
