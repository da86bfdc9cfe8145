"""The fair peer: a plain FastAPI server over ONNX Runtime on the same INT8 file we serve.

    python -m benchmarks.ort_server --classify .cache/bundles/sst2-minilm --qa .cache/bundles/squad-minilm

What a user would write with the Optimum recipe instead of our service: the `transformers` fast
tokenizer, one InferenceSession per model shared by all requests, one `session.run` per request
(a QA request's windows together), no batching across requests, plain sync `def` endpoints
(FastAPI's thread pool) and uvicorn's defaults. It loads a bundle's ONNX file (`--variant`, the
one our server picks by default), with the variant's `disabled_optimizers` from bundle.json, so
both servers run exactly the same graph; ONNX Runtime's own thread defaults otherwise. QA spans
come from `pipeline_server.HFQuestionAnswering`'s n-best search over the same windows, so only
the forward pass differs from the `transformers` baseline. Request and response shapes are ours,
so benchmarks/loadgen.py drives it unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException

from app.backend.runtime import choose_variant
from benchmarks.pipeline_server import (
    ClassifyIn,
    HFQuestionAnswering,
    _quiet_transformers,
    add_probes,
    add_qa_route,
    classify_items,
    classify_response,
    qa_settings_from_bundle,
    serve,
)
from export.bundle import load_bundle_manifest, verify_bundle_files
from export.int8_precision import exact_int8


class OrtModel:
    """A bundle variant's ONNX file in one InferenceSession, with the fast tokenizer beside it."""

    def __init__(self, bundle: str | Path, variant: str | None, threads: int):
        import onnxruntime as ort

        transformers = _quiet_transformers()
        self.manifest = load_bundle_manifest(bundle)
        self.variant = variant or choose_variant("cpu", self.manifest.variants)
        verify_bundle_files(bundle, self.manifest, self.variant)
        info = self.manifest.variants[self.variant]
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: ONNX Runtime's default, every core
        # The same exact INT8 kernels as ours on a CPU without VNNI: the same computation, compared.
        exact_int8(options)
        extra = {"disabled_optimizers": info.disabled_optimizers} if info.disabled_optimizers else {}
        path = str(Path(bundle) / info.file)
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"], **extra)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(bundle))

    def run(self, encoded) -> list[np.ndarray]:
        return self.session.run(None, {name: np.asarray(encoded[name], np.int64) for name in self.inputs})


class OrtQuestionAnswering(HFQuestionAnswering):
    """HFQuestionAnswering's windows and span search, forward pass on ONNX Runtime."""

    def __init__(self, model: OrtModel, bundle: str | Path):
        self.kind = f"transformers fast-tokenizer windows + ONNX Runtime ({model.variant})"
        self.settings = qa_settings_from_bundle(bundle)
        self.tokenizer = model.tokenizer
        self.model = model

    def forward(self, encoded) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.model.run(encoded)
        return start, end


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def create_app(
    classify: str | Path | None = None, qa: str | Path | None = None, *, variant: str | None, threads: int
) -> FastAPI:
    if not (classify or qa):
        raise ValueError("give at least one bundle directory (classify or qa)")
    classifier = OrtModel(classify, variant, threads) if classify else None
    reader = OrtQuestionAnswering(OrtModel(qa, variant, threads), qa) if qa else None
    app = FastAPI(title="plain ONNX Runtime server")
    app.state.info = {
        "classify": str(classify) if classify else None,
        "qa": str(qa) if qa else None,
        "variant": (classifier or (reader.model if reader else None)).variant,  # type: ignore[union-attr]
        "intra_op_threads": threads,
    }

    add_probes(app)

    def missing(task: str) -> HTTPException:
        return HTTPException(404, {"error": "no_model", "message": f"no {task} bundle loaded"})

    @app.post("/classify")
    def classify_endpoint(request: ClassifyIn) -> dict[str, Any]:
        if classifier is None:
            raise missing("classify")
        tokenizer, max_length = classifier.tokenizer, classifier.manifest.max_seq_len
        rows = [
            tokenizer(i.text, i.text_pair, truncation=True, max_length=max_length)
            for i in classify_items(request)
        ]
        probabilities = softmax(classifier.run(tokenizer.pad(rows, return_tensors="np"))[0])
        labels = classifier.manifest.labels or []
        return classify_response(
            request, [[(labels[k], row[k]) for k in np.argsort(row)[::-1]] for row in probabilities]
        )

    add_qa_route(app, reader, missing)

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classify", help="classify bundle directory")
    p.add_argument("--qa", help="qa bundle directory")
    p.add_argument("--variant", help="bundle variant (default: the one our server picks on CPU)")
    p.add_argument("--port", type=int, default=8002)
    args = p.parse_args(argv)
    if not (args.classify or args.qa):
        p.error("give at least one of --classify, --qa")
    return serve(create_app(args.classify, args.qa, variant=args.variant, threads=0), "plain ORT", args.port)


if __name__ == "__main__":
    sys.exit(main())
