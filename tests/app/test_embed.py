"""Sentence embeddings through the live app: TEI's /embed and /similarity, OpenAI's /v1/embeddings.

Vectors are checked against the bundle computed offline and against the sentence-transformers
package on the same folder; a text's vector must be bit-identical alone and in any batch.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest

from processing.embed import from_base64, normalize
from tests.export.test_sentence_encoder import SENTENCES, bundle_vectors, cosines, st_folder

from .conftest import MAX_SEQ_LEN, serving

LONG = "the cat sat on the mat and " * 20  # 140 tokens of the tiny vocabulary, beyond MAX_SEQ_LEN


@pytest.fixture
def embed_dir(make_models_dir):
    return make_models_dir(("embed",))


async def embed(client, payload, path="/embed", status=200):
    response = await client.post(path, json=payload)
    assert response.status_code == status, response.text
    return response


async def test_embed_answers_tei_shapes_and_the_offline_vectors(served, app_bundles):
    _, client = served
    one = (await embed(client, {"inputs": "the cat sat on the mat"})).json()
    many = await embed(client, {"inputs": SENTENCES, "normalize": False})
    assert isinstance(one, list) and len(one) == 1 and len(one[0]) == 32  # TEI: a bare list of vectors
    assert np.linalg.norm(one[0]) == pytest.approx(1.0, abs=1e-6)  # normalize defaults to true
    assert many.headers["x-model"] == "embed" and "x-truncated-inputs" not in many.headers
    offline = bundle_vectors(app_bundles["embed"], SENTENCES, "int8-rowwise")
    np.testing.assert_allclose(np.asarray(many.json()), offline, atol=1e-6)


async def test_a_text_gets_the_same_vector_alone_and_in_any_batch(served):
    """Rows of different lengths, in one request and in concurrent requests batched together:
    every vector is bit-identical to the text's vector alone."""
    texts = [*SENTENCES, "mary", LONG[:60], "where is the house of the team that won the game"]
    _, client = served
    alone = [(await embed(client, {"inputs": t})).json()[0] for t in texts]
    together = (await embed(client, {"inputs": texts})).json()
    reversed_batch = (await embed(client, {"inputs": texts[::-1]})).json()[::-1]
    concurrent = await asyncio.gather(
        *(embed(client, {"inputs": [t, *texts[:i]]}) for i, t in enumerate(texts))
    )
    assert together == alone and reversed_batch == alone
    assert [r.json()[0] for r in concurrent] == alone


async def test_the_service_matches_sentence_transformers_on_its_folder(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from export import export_bundle

    folder = st_folder(tmp_path / "st", {"pooling_mode_mean_tokens": True}, True)
    rowwise = ("int8-rowwise", "int8-rowwise-avx2")
    export_bundle(folder, tmp_path / "models" / "st-mini", variants=("fp32", *rowwise))
    reference = st.SentenceTransformer(str(folder), device="cpu").encode(SENTENCES)
    for variant, bound in (("fp32", 0.99999), *((v, 0.999) for v in rowwise)):
        async with serving(tmp_path / "models", cpu_variant=variant) as (_, client):
            got = np.asarray((await embed(client, {"inputs": SENTENCES})).json())
        assert cosines(got, reference).min() >= bound, (variant, cosines(got, reference))
        if variant == "fp32":
            assert np.abs(got - reference).max() <= 1e-5


async def test_openai_embeddings(served):
    _, client = served
    floats = (await embed(client, {"input": SENTENCES[:2], "model": "embed"}, "/v1/embeddings")).json()
    packed = await embed(
        client, {"input": SENTENCES[0], "encoding_format": "base64", "dimensions": 32}, "/v1/embeddings"
    )
    tei = (await embed(client, {"inputs": SENTENCES[:2]})).json()
    assert floats["object"] == "list" and floats["model"] == "embed"
    assert [d["object"] for d in floats["data"]] == ["embedding"] * 2 and [
        d["index"] for d in floats["data"]
    ] == [0, 1]
    assert [d["embedding"] for d in floats["data"]] == tei  # OpenAI's vectors are normalized too
    # [CLS] the cat sat on the mat [SEP] + [CLS] john lives in paris [SEP]
    assert floats["usage"] == {"prompt_tokens": 8 + 6, "total_tokens": 8 + 6}
    data = packed.json()["data"]
    assert len(data) == 1 and isinstance(data[0]["embedding"], str)
    np.testing.assert_array_equal(from_base64(data[0]["embedding"]), np.asarray(tei[0], dtype=np.float32))


async def test_similarity_is_the_cosine_of_the_embeddings(served):
    sentences = [SENTENCES[0], SENTENCES[1], "the cat sat on a mat"]
    body = {"inputs": {"source_sentence": SENTENCES[0], "sentences": sentences}}
    _, client = served
    scores = (await embed(client, body, "/similarity")).json()
    vectors = np.asarray((await embed(client, {"inputs": [SENTENCES[0], *sentences]})).json())
    assert len(scores) == 3 and scores[0] == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(scores, vectors[1:] @ vectors[0], atol=1e-6)
    assert scores[2] > scores[1]  # one word changed is closer than another sentence


async def test_long_inputs_follow_the_classification_rule_and_say_so(served, embed_dir):
    texts = ["a great movie", LONG]
    _, client = served
    cut = await embed(client, {"inputs": texts})
    asked = await embed(client, {"inputs": texts, "truncate": True})
    left = await embed(client, {"inputs": [LONG], "truncation_direction": "Left"})
    refused = await embed(client, {"inputs": texts, "truncate": False}, status=413)
    assert cut.headers["x-truncated-inputs"] == "1" and "x-windowed-inputs" not in cut.headers
    assert asked.json() == cut.json()
    assert refused.json()["error"] == "input_too_long"
    assert refused.json()["fields"][0]["field"] == "inputs.1"
    assert "has 142 tokens and the model reads at most 64" in refused.json()["message"]
    # Kept from the left, the text ends "... the mat and": another vector than the one cut on the right.
    assert left.headers["x-truncated-inputs"] == "0" and left.json()[0] != cut.json()[1]
    async with serving(embed_dir, classify_long_text="windows") as (_, client):
        windowed = await embed(client, {"inputs": texts})
        pinned = await embed(client, {"inputs": texts, "truncate": True})
    assert windowed.headers["x-windowed-inputs"] == "1=3" and "x-truncated-inputs" not in windowed.headers
    assert windowed.json()[0] == cut.json()[0] and windowed.json()[1] != cut.json()[1]
    assert pinned.json() == cut.json()  # truncate: true overrides the server's windows
    # The windows' vectors are pooled again by the model's rule (mean, weighted by tokens).
    assert np.linalg.norm(windowed.json()[1]) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    ("path", "payload", "status", "field", "message"),
    [
        ("/embed", {"inputs": []}, 422, "inputs", "at least 1 item"),
        ("/embed", {"inputs": "  "}, 422, "inputs.0", "must not be empty"),
        ("/embed", {"inputs": ["a", None]}, 422, "inputs.1", "valid string"),
        ("/embed", {"inputs": "a", "normalize": "yes"}, 422, "normalize", "valid boolean"),
        ("/embed", {"inputs": "a", "truncation_direction": "middle"}, 422, "truncation_direction", "'right'"),
        (
            "/embed",
            {"inputs": "a", "prompt_name": "query"},
            422,
            "prompt_name",
            "has no prompt 'query'; its prompts: none",
        ),
        ("/embed", {"text": "a"}, 422, "inputs", "Field required"),
        ("/embed", {"inputs": ["a"] * 65}, 422, "inputs", "65 texts; the limit is 64 (MAX_BATCH_ITEMS)"),
        ("/embed", {"inputs": "a" * 20_001}, 413, "inputs.0", "MAX_TEXT_CHARS"),
        (
            "/embed",
            {"inputs": "a", "model": "sst2"},
            404,
            "model",
            "does not exist; models: classify (classify), embed (embed)",
        ),
        ("/v1/embeddings", {"input": [101, 2023]}, 422, "input", "token-id arrays are not supported"),
        ("/v1/embeddings", {"input": [[101, 2023]]}, 422, "input", "token-id arrays are not supported"),
        ("/v1/embeddings", {"input": "a", "dimensions": 16}, 422, "dimensions", "cannot shorten"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, 422, "encoding_format", "'float'"),
        ("/v1/embeddings", {"inputs": "a"}, 422, "input", "Field required"),
        (
            "/similarity",
            {"inputs": {"source_sentence": "a", "sentences": []}},
            422,
            "inputs.sentences",
            "at least",
        ),
        ("/similarity", {"inputs": {"source_sentence": "a"}}, 422, "inputs.sentences", "Field required"),
        ("/similarity", {"inputs": ["a", "b"]}, 422, "inputs", "valid dictionary"),
    ],
)
async def test_bad_requests_get_a_4xx_naming_the_problem(served, path, payload, status, field, message):
    _, client = served
    response = await embed(client, payload, path, status=status)
    body = response.json()
    assert field in [f["field"] for f in body.get("fields") or []], body
    assert message in body["message"], body


async def test_the_embed_model_is_listed_with_its_pooling(served):
    _, client = served
    (model,) = [m for m in (await client.get("/models")).json()["models"] if m["task"] == "embed"]
    assert model["max_seq_len"] == MAX_SEQ_LEN
    assert model["pooling"] == {"mode": "mean", "normalize": False, "dimensions": 32}


def test_normalize_matches_torch():
    torch = pytest.importorskip("torch")
    vectors = np.random.default_rng(0).normal(size=(4, 32)).astype(np.float32)
    vectors[1] = 0.0  # a zero vector stays zero instead of dividing by zero
    expected = torch.nn.functional.normalize(torch.from_numpy(vectors), dim=-1).numpy()
    np.testing.assert_allclose(normalize(vectors), expected, atol=1e-7)


def test_the_tiny_bundle_is_a_sentence_encoder(app_bundles, tmp_path):
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(shutil.copytree(app_bundles["embed"], tmp_path / "b"))
    assert manifest.task == "embed" and manifest.outputs[0]["name"] == "last_hidden_state"


DEFAULT_BUNDLE = Path(__file__).resolve().parents[2] / ".cache" / "bundles" / "all-minilm-l6-v2"


@pytest.mark.slow
async def test_the_minilm_default_matches_sentence_transformers(tmp_path):
    """The real default, served: within cosine 0.99999 of sentence-transformers in fp32 and 0.999 in
    the per-token INT8 variants on the crafted texts (one word, other scripts, emoji, code, texts
    beyond 256 tokens); benchmarks/results/embed_quality.md measures 200 texts."""
    st = pytest.importorskip("sentence_transformers")
    if not (DEFAULT_BUNDLE / "bundle.json").exists():
        pytest.skip(f"{DEFAULT_BUNDLE} is not built (python -m export.defaults --out .cache/bundles)")
    from benchmarks.embed_data import CRAFTED
    from model.checkpoint import minilm_package_dir

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / DEFAULT_BUNDLE.name).symlink_to(DEFAULT_BUNDLE, target_is_directory=True)
    reference = st.SentenceTransformer(str(minilm_package_dir()), device="cpu").encode(CRAFTED)
    for variant, bound in (("fp32", 0.99999), ("int8-rowwise", 0.999), ("int8-rowwise-avx2", 0.999)):
        async with serving(tmp_path / "models", cpu_variant=variant) as (_, client):
            got = np.asarray((await embed(client, {"inputs": CRAFTED})).json())
            alone = [(await embed(client, {"inputs": text})).json()[0] for text in CRAFTED[:8]]
        assert cosines(got, reference).min() >= bound, (variant, cosines(got, reference).min())
        assert alone == got[:8].tolist()
