"""TEI's retrieval outputs through the live app: /embed_sparse (SPLADE) against sentence-transformers'
SparseEncoder on the same checkpoint, /embed_all (a vector per token) against /embed, both through
KServe V2; and sentence-transformers prompts (TEI's prompt_name) and Dense layers on an MPNet folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.export.test_mpnet_export import SENTENCES, st_mpnet_folder

from .conftest import serving

LONG = "the cat sat on the mat and " * 20  # beyond the tiny bundles' 64 tokens


async def post(client, path: str, payload: dict, status: int = 200):
    response = await client.post(path, json=payload)
    assert response.status_code == status, response.text
    return response


def dense(pairs: list[dict], size: int) -> np.ndarray:
    out = np.zeros(size, np.float32)
    for pair in pairs:
        out[pair["index"]] = pair["value"]
    return out


async def test_embed_sparse_equals_sentence_transformers_sparse_encoder(served, tiny_models):
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    _, client = served
    checkpoint = tiny_models.checkpoint("sparse")  # the served "sparse" bundle's weights
    encoder = st.SparseEncoder(modules=[MLMTransformer(str(checkpoint)), SpladePooling("max")], device="cpu")
    reference = encoder.encode(SENTENCES, convert_to_tensor=True).to_dense().numpy()
    answer = (await post(client, "/embed_sparse", {"inputs": SENTENCES})).json()
    assert len(answer) == len(SENTENCES)
    for pairs, expected in zip(answer, reference, strict=True):
        indices = [p["index"] for p in pairs]
        assert indices == sorted(indices) and all(p["value"] > 0 for p in pairs)  # TEI's shape
        got = dense(pairs, len(expected))
        # The served variant is int8-rowwise: the weights within INT8's error, the terms the same.
        assert np.abs(got - expected).max() <= 0.05 * expected.max()
        strong = expected > 0.1 * expected.max()
        assert (got[strong] > 0).all()
    alone = (await post(client, "/embed_sparse", {"inputs": SENTENCES[3]})).json()
    assert alone[0] == answer[3]  # a text's weights do not depend on its batch


async def test_embed_sparse_fp32_matches_the_reference_exactly(make_models_dir, tiny_models):
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    checkpoint = tiny_models.checkpoint("sparse")
    encoder = st.SparseEncoder(modules=[MLMTransformer(str(checkpoint)), SpladePooling("max")], device="cpu")
    reference = encoder.encode(SENTENCES, convert_to_tensor=True).to_dense().numpy()
    async with serving(make_models_dir(("sparse",)), cpu_variant="fp32") as (_, client):
        answer = (await post(client, "/embed_sparse", {"inputs": SENTENCES})).json()
    got = np.stack([dense(pairs, reference.shape[1]) for pairs in answer])
    assert np.abs(got - reference).max() <= 1e-5


async def test_embed_sparse_refuses_what_embed_refuses(served):
    _, client = served
    response = await post(client, "/embed_sparse", {"inputs": LONG, "truncate": False}, 413)
    assert "tokens and the model reads at most 64" in response.json()["message"]
    await post(client, "/embed_sparse", {"inputs": ""}, 422)
    response = await post(client, "/embed_sparse", {"inputs": "a", "prompt_name": "query"}, 422)
    assert "no prompt 'query'" in response.json()["message"]


async def test_embed_all_gives_every_token_and_pools_to_embed(served):
    _, client = served
    tokens = (await client.post("/tokenize", json={"inputs": SENTENCES})).json()
    per_token = (await post(client, "/embed_all", {"inputs": SENTENCES})).json()
    pooled = (await post(client, "/embed", {"inputs": SENTENCES, "normalize": False})).json()
    for states, spans, vector in zip(per_token, tokens, pooled, strict=True):
        assert len(states) == len(spans) and all(len(v) == 32 for v in states)  # [CLS] ... [SEP]
        np.testing.assert_allclose(np.mean(states, axis=0), vector, atol=1e-5)  # the model pools by mean
    cut = await post(client, "/embed_all", {"inputs": LONG})
    assert len(cut.json()[0]) == 64 and cut.headers["x-truncated-inputs"] == "0"
    response = await post(client, "/embed_all", {"inputs": LONG, "truncate": False}, 413)
    assert "truncate" in response.json()["message"]


async def test_both_outputs_through_kserve_v2(served):
    _, client = served
    body = {"inputs": [{"name": "inputs", "shape": [2], "datatype": "BYTES", "data": SENTENCES[:2]}]}
    sparse = (await post(client, "/v2/models/sparse/infer", body)).json()
    native = (await post(client, "/embed_sparse", {"inputs": SENTENCES[:2]})).json()
    [output] = sparse["outputs"]
    assert output["name"] == "sparse" and output["shape"] == [2]
    assert [json.loads(row) for row in output["data"]] == native
    asked = {**body, "outputs": [{"name": "token_embeddings"}, {"name": "embedding"}]}
    both = {o["name"]: o for o in (await post(client, "/v2/models/embed/infer", asked)).json()["outputs"]}
    per_token = (await post(client, "/embed_all", {"inputs": SENTENCES[:2]})).json()
    assert [json.loads(row) for row in both["token_embeddings"]["data"]] == per_token
    assert both["embedding"]["shape"] == [2, 32]
    default = (await post(client, "/v2/models/embed/infer", body)).json()["outputs"]
    assert [o["name"] for o in default] == ["embedding"]  # per-token vectors only when asked for
    meta = (await client.get("/v2/models/embed")).json()
    assert "token_embeddings" in [o["name"] for o in meta["outputs"]]


async def test_prompts_and_dense_layers_of_a_sentence_transformers_mpnet_folder(tmp_path):
    from export.pipeline import export_bundle

    model, folder = st_mpnet_folder(tmp_path, "mean", "Tanh", True)
    export_bundle(folder, tmp_path / "models" / "mpnet", variants=("fp32", "int8-rowwise"))
    async with serving(tmp_path / "models", cpu_variant="fp32") as (_, client):
        for name in ("query", "passage"):
            got = (await post(client, "/embed", {"inputs": SENTENCES, "prompt_name": name})).json()
            expected = model.encode(SENTENCES, prompt_name=name, convert_to_numpy=True)
            assert np.abs(np.asarray(got) - expected).max() <= 1e-5
        default = (await post(client, "/embed", {"inputs": SENTENCES})).json()
        passage = (await post(client, "/embed", {"inputs": SENTENCES, "prompt_name": "passage"})).json()
        assert default == passage  # default_prompt_name
        openai = (
            await post(client, "/v1/embeddings", {"input": SENTENCES[0], "prompt_name": "query"})
        ).json()
        assert len(openai["data"][0]["embedding"]) == 16  # the Dense layer's width
        response = await post(client, "/embed", {"inputs": "a", "prompt_name": "title"}, 422)
        assert "has no prompt 'title'; its prompts: document, passage, query" in response.json()["message"]
