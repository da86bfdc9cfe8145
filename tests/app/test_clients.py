"""Real clients against a live server (uvicorn on loopback, the session's tiny bundles): the official
`openai` client, LangChain's OpenAIEmbeddings and huggingface_hub's InferenceClient (TEI's client).
What they send by default must work as they expect."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

TEXTS = ["a great film", "mary won the game"]


def embed(url: str, texts: list[str]) -> np.ndarray:
    reply = httpx.post(f"{url}/embed", json={"inputs": texts}, timeout=30)
    assert reply.status_code == 200, reply.text
    return np.asarray(reply.json())


def test_the_openai_client_lists_models_and_embeds(keyless_live):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{keyless_live.url}/v1", api_key="unused", max_retries=0)
    ids = {model.id for model in client.models.list()}
    assert ids == {"classify", "ner", "multiple-choice", "qa", "embed", "sparse"}
    # The client asks for base64 unless told otherwise, and decodes it itself.
    named = client.embeddings.create(model="embed", input=TEXTS)
    floats = client.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
    ada = client.embeddings.create(model="text-embedding-ada-002", input=TEXTS[0])
    expected = embed(keyless_live.url, TEXTS)
    assert named.model == "embed" and [d.index for d in named.data] == [0, 1]
    np.testing.assert_allclose([d.embedding for d in named.data], expected, atol=1e-6)
    np.testing.assert_allclose([d.embedding for d in floats.data], expected, atol=1e-6)
    assert named.usage.prompt_tokens == named.usage.total_tokens > 0
    assert ada.model == "embed"  # OpenAI's own name: the embedding default served, and says so
    np.testing.assert_allclose(ada.data[0].embedding, expected[0], atol=1e-6)
    with pytest.raises(openai.NotFoundError) as refused:  # any other unknown name is refused
        client.embeddings.create(model="no-such-model", input=TEXTS[0])
    assert refused.value.response.json()["error"] == "no_model"


def test_langchain_openai_embeddings(keyless_live):
    langchain_openai = pytest.importorskip("langchain_openai")
    expected = embed(keyless_live.url, TEXTS)
    for model in ({}, {"model": "embed"}):  # LangChain's default model name, then ours
        embeddings = langchain_openai.OpenAIEmbeddings(
            base_url=f"{keyless_live.url}/v1", api_key="unused", check_embedding_ctx_length=False, **model
        )
        np.testing.assert_allclose(embeddings.embed_documents(TEXTS), expected, atol=1e-6)
        np.testing.assert_allclose(embeddings.embed_query(TEXTS[1]), expected[1], atol=1e-6)


def test_huggingface_hub_inference_client_at_the_root(keyless_live):
    hub = pytest.importorskip("huggingface_hub")
    url = keyless_live.url
    client = hub.InferenceClient(model=url, provider="hf-inference")  # the root, as for a TEI server
    assert client.health_check()
    assert client.get_endpoint_info()["model_type"] == {"embedding": {"pooling": "mean"}}
    np.testing.assert_allclose(client.feature_extraction(TEXTS[0]), embed(url, TEXTS[:1]), atol=1e-6)
    raw = httpx.post(f"{url}/embed", json={"inputs": TEXTS[0], "normalize": False}, timeout=30).json()
    # Its options travel in `parameters`, honoured here (TEI drops them).
    np.testing.assert_allclose(client.feature_extraction(TEXTS[0], normalize=False), raw, atol=1e-6)
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    vectors = embed(url, TEXTS + ["a terrible film"])
    similarity = client.sentence_similarity(TEXTS[0], [TEXTS[1], "a terrible film"])
    np.testing.assert_allclose(similarity, vectors[1:] @ vectors[0], atol=1e-5)
    # A model's own root: the client's one URL per model.
    own = hub.InferenceClient(model=f"{url}/models/embed", provider="hf-inference")
    assert own.health_check() and own.get_endpoint_info()["model_id"] == "embed"
    np.testing.assert_allclose(own.feature_extraction(TEXTS[0]), embed(url, TEXTS[:1]), atol=1e-6)
    # A named route: TEI's /predict, with Hugging Face's top_k.
    predict = hub.InferenceClient(model=f"{url}/predict", provider="hf-inference")
    best = httpx.post(f"{url}/predict", json={"inputs": TEXTS[0]}, timeout=30).json()[0]
    # TEI's flat list for one input: the client gives its first element, the best label.
    assert predict.text_classification(TEXTS[0], top_k=1).label == best["label"]
    with pytest.raises(hub.errors.HfHubHTTPError) as refused:  # an option /predict lacks: named
        predict.text_classification(TEXTS[0], function_to_apply="none")
    assert "parameters.function_to_apply" in refused.value.response.text
