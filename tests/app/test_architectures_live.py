"""RoBERTa, XLM-RoBERTa, ELECTRA and DistilBERT served: a tiny model of each architecture, with its
kind of tokenizer (byte-level BPE, Unigram, WordPiece), answers every task route on the CPU default
(int8-rowwise); a one-logit cross-encoder answers /rerank. Through the fp32 variant the service's
answers equal `transformers` run on `transformers`' own tokenization of the same text. Every variant
of every head is exported and checked in tests/export/test_architecture_exports.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from export import export_bundle
from export.bundle import load_bundle_manifest
from model.tiny import TASK_LABELS

from .conftest import MAX_SEQ_LEN, serving

transformers = pytest.importorskip("transformers")

ARCHITECTURES = ("roberta", "xlm-roberta", "electra", "distilbert")
TASKS = ("classify", "ner", "qa", "multiple-choice", "embed")
TEXT = "  John Smith lives in São Paulo 🙂 北京!"
PAIR = ("where does john live?", "john lives in paris, the capital of france.")
SERVED = ("fp32", "int8-rowwise")  # what the two servers below run
PASSAGES = ["the house is in the city", "mary won the game", "北京 is a city", "  where is mary?"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch(request, tiny_models, tmp_path_factory) -> tuple[str, Path]:
    """A MODELS_DIR with the architecture's five task bundles (every variant) and a reranker."""
    model_type = request.param
    root = tmp_path_factory.mktemp(f"{model_type}-models")
    for task in TASKS:
        export_bundle(
            tiny_models.checkpoint(task, model_type=model_type),
            root / task,
            max_seq_len=MAX_SEQ_LEN,
            variants=SERVED,
            name=f"{model_type}-{task}",
        )
    export_bundle(
        tiny_models.checkpoint("classify", seed=3, labels=("relevance",), model_type=model_type),
        root / "reranker",
        max_seq_len=MAX_SEQ_LEN,
        variants=SERVED,
        name=f"{model_type}-reranker",
        reranker=True,
    )
    return model_type, root


def hf_tokenizer(checkpoint: Path):
    if (checkpoint / "tokenizer.json").exists():
        return transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(checkpoint / "tokenizer.json"), pad_token="<pad>"
        )
    return transformers.AutoTokenizer.from_pretrained(checkpoint)  # vocab.txt: BertTokenizer


def hf_run(checkpoint: Path, auto: str, text, pair=None):
    """transformers' model on transformers' tokenization (what a user of that model would run)."""
    model = getattr(transformers, auto).from_pretrained(checkpoint).eval()
    inputs = hf_tokenizer(checkpoint)(text, pair, return_tensors="pt", padding=True)
    if "token_type_ids" in inputs and getattr(model.config, "type_vocab_size", 2) < 2:
        del inputs["token_type_ids"]  # RoBERTa's tokenizers give none
    with torch.no_grad():
        return model(**inputs), inputs


async def post(client, path, body):
    response = await client.post(path, json=body)
    assert response.status_code == 200, (path, response.text)
    return response.json()


def test_the_graphs_read_the_inputs_their_architecture_uses(arch):
    model_type, root = arch
    for task in TASKS:
        manifest = load_bundle_manifest(root / task)
        assert manifest.verification["fp32"]["passed"], (model_type, task)
        assert manifest.verification["int8-rowwise"]["batch_invariance"]["invariant"]
        reads_types = model_type == "electra"  # RoBERTa has one token type, DistilBERT none
        assert ("token_type_ids" in manifest.input_names) == reads_types, manifest.input_names


async def test_fp32_answers_equal_transformers_on_its_own_tokens(arch, tiny_models):
    model_type, root = arch
    classify = tiny_models.checkpoint("classify", model_type=model_type)
    reranker = tiny_models.checkpoint("classify", seed=3, labels=("relevance",), model_type=model_type)
    encoder = tiny_models.checkpoint("embed", model_type=model_type)
    async with serving(root, cpu_variant="fp32") as (_, client):
        for text, pair in [(TEXT, None), PAIR]:
            body = {"text": text, **({"text_pair": pair} if pair else {}), "model": "classify"}
            served = await post(client, "/classify", body)
            out, _ = hf_run(classify, "AutoModelForSequenceClassification", text, pair)
            probs = torch.softmax(out.logits[0], -1).tolist()
            labels = TASK_LABELS["classify"]
            got = {s["label"]: s["score"] for s in served["scores"]}
            assert max(abs(got[label] - p) for label, p in zip(labels, probs, strict=True)) < 1e-5
        ranked = await post(client, "/rerank", {"query": PAIR[0], "texts": PASSAGES, "raw_scores": True})
        out, _ = hf_run(reranker, "AutoModelForSequenceClassification", [PAIR[0]] * 4, PASSAGES)
        assert out.logits.shape == (4, 1)  # one output logit, as bge-reranker
        for row in ranked:
            assert math.isclose(row["score"], out.logits[row["index"], 0].item(), abs_tol=1e-4)
        vectors = await post(client, "/embed", {"inputs": [TEXT, PAIR[1]], "normalize": False})
        out, inputs = hf_run(encoder, "AutoModel", [TEXT, PAIR[1]])
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        mean = (out.last_hidden_state * mask).sum(1) / mask.sum(1)
        assert np.abs(np.asarray(vectors) - mean.numpy()).max() < 1e-4


async def test_every_task_route_answers_on_the_default_variant(arch):
    model_type, root = arch
    async with serving(root) as (_, client):
        models = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
        assert models["classify"]["status"] == "ready"
        body = {"text": TEXT, "model": "classify"}
        assert (await post(client, "/classify", body))["label"] in ("negative", "positive")
        pair = {"text": PAIR[0], "text_pair": PAIR[1], "model": "classify"}
        assert len((await post(client, "/classify", pair))["scores"]) == 2
        ranked = await post(client, "/rerank", {"query": PAIR[0], "texts": PASSAGES})
        assert sorted(r["index"] for r in ranked) == [0, 1, 2, 3]
        assert all(0 < r["score"] < 1 for r in ranked)
        long_text = "john smith lives in são paulo and mary in 北京 . " * 12  # several windows
        for aggregation in ("none", "simple", "first", "average", "max"):
            found = await post(client, "/ner", {"text": long_text, "aggregation": aggregation})
            assert found["windows"] > 1
            for entity in found["entities"]:
                assert long_text[entity["start"] : entity["end"]] == entity["text"]
                assert entity["text"] == entity["text"].strip() and entity["text"]
        context = "john smith lives in são paulo , 北京 is far 🙂 . " * 10
        answered = await post(
            client, "/qa", {"question": "  where does john live?", "context": context, "top_k": 3}
        )
        assert answered["windows"] > 1 and len(answered["answers"]) == 3
        for answer in answered["answers"]:
            assert context[answer["start"] : answer["end"]] == answer["text"]
        choice = {"context": TEXT, "question": "who is he?", "choices": ["john", "mary", "北京"]}
        picked = await post(client, "/multiple-choice", choice)
        assert picked["choice"] == choice["choices"][picked["best"]] and len(picked["scores"]) == 3
        vectors = await post(client, "/embed", {"inputs": [TEXT, "mary"]})
        assert len(vectors) == 2 and all(math.isclose(np.linalg.norm(v), 1.0, rel_tol=1e-5) for v in vectors)
        openai = await post(client, "/v1/embeddings", {"input": [TEXT], "model": "embed"})
        assert len(openai["data"]) == 1
        tokens = await post(client, "/tokenize", {"inputs": TEXT, "model": "ner"})
        assert json.dumps(tokens) and tokens[0][0]["special"]
