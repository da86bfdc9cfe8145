"""The peer for /embed: a plain FastAPI server wrapping `sentence-transformers`.

    python -m benchmarks.st_server --model minilm --port 8003

What a user would write instead of our service: one SentenceTransformer loaded at startup, a
plain sync `def` endpoint (FastAPI's thread pool) that calls `model.encode` on the request's
texts, torch's default threads, uvicorn's defaults. It speaks TEI's /embed shape (`inputs` a
string or a list, `normalize`), so the embedding benchmark drives both servers with the same bodies.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from benchmarks.pipeline_server import add_probes, serve
from model.checkpoint import resolve_base


class EmbedIn(BaseModel):
    inputs: str | list[str]
    normalize: bool = True


def create_app(model_dir: str) -> FastAPI:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(resolve_base(model_dir)), device="cpu")
    app = FastAPI()
    app.state.info = {"models": [{"name": "sentence-transformers", "task": "embed", "status": "ready"}]}
    add_probes(app)

    @app.post("/embed")
    def embed(request: EmbedIn) -> list[list[float]]:
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        vectors: Any = model.encode(texts, normalize_embeddings=request.normalize, convert_to_numpy=True)
        return vectors.tolist()

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default="minilm", help="a sentence-transformers folder (minilm: the pip package's)"
    )
    p.add_argument("--port", type=int, default=8003)
    args = p.parse_args(argv)
    return serve(create_app(args.model), "sentence-transformers baseline", args.port)


if __name__ == "__main__":
    sys.exit(main())
