"""Peers as their docs write them, in FastAPI: optimum and fastembed from their own environments
(peer_envs.py), sentence-transformers (the /embed floor) from ours. Standalone: the peers'
environments hold nothing of this repository.

    .cache/peers/optimum/venv/bin/python benchmarks/peer_server.py optimum --classify DIR --embed DIR
    .cache/peers/fastembed/venv/bin/python benchmarks/peer_server.py fastembed --embed DIR
    .venv/bin/python benchmarks/peer_server.py st --embed .cache/peers/models/all-minilm-l6-v2
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel


class EmbedIn(BaseModel):
    inputs: str | list[str]
    normalize: bool = True


class ClassifyIn(BaseModel):
    text: str


def optimum_models(classify: str | None, embed: str | None):
    from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTModelForSequenceClassification
    from transformers import AutoTokenizer, pipeline

    classifier = extractor = None
    if classify:
        model = ORTModelForSequenceClassification.from_pretrained(classify)
        classifier = pipeline(
            "text-classification", model=model, tokenizer=AutoTokenizer.from_pretrained(classify)
        )
    if embed:
        model = ORTModelForFeatureExtraction.from_pretrained(embed)
        pipe = pipeline("feature-extraction", model=model, tokenizer=AutoTokenizer.from_pretrained(embed))

        def extractor(texts: list[str]) -> np.ndarray:  # one text per forward pass: no padding to mask
            return np.stack([np.asarray(tokens[0]).mean(0) for tokens in pipe(texts)])

    return classifier, extractor


def fastembed_model(embed: str):
    from fastembed import TextEmbedding

    model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=embed)
    return lambda texts: np.stack(list(model.embed(texts)))


def st_model(embed: str):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(embed, device="cpu")
    return lambda texts: model.encode(texts, convert_to_numpy=True)


def create_app(classifier, extractor) -> FastAPI:
    app = FastAPI()

    @app.get("/ready")
    def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/classify")
    def classify(request: ClassifyIn) -> dict[str, Any]:
        scores = classifier(request.text, top_k=None)
        return {"label": scores[0]["label"], "score": scores[0]["score"], "scores": scores}

    @app.post("/embed")
    def embed(request: EmbedIn) -> list[list[float]]:
        vectors = extractor([request.inputs] if isinstance(request.inputs, str) else request.inputs)
        if request.normalize:
            vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors.tolist()

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("engine", choices=("optimum", "fastembed", "st"))
    p.add_argument("--classify", help="ONNX export of a text-classification checkpoint (optimum only)")
    p.add_argument("--embed", help="ONNX export of all-MiniLM-L6-v2 (model.onnx + tokenizer)")
    p.add_argument("--port", type=int, default=8004)
    args = p.parse_args()
    if args.engine == "optimum":
        classifier, extractor = optimum_models(args.classify, args.embed)
    else:
        classifier, extractor = None, (st_model if args.engine == "st" else fastembed_model)(args.embed)
    uvicorn.run(create_app(classifier, extractor), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
