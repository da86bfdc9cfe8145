"""The floors: what a user would write instead of our service, FastAPI over `transformers` or ORT
(benchmarks/README.md): plain sync endpoints, no batching across requests, our request and response
shapes; /qa is `HFQuestionAnswering` (transformers 5 removed the QA pipeline).

    python -m benchmarks.pipeline_server --classify runs/sst2/best --qa runs/squad/best --port 8001
    python -m benchmarks.pipeline_server --ort --classify .cache/bundles/sst2-minilm --port 8002
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from app.engine.runtime import choose_variant
from export.bundle import DEFAULT_QA, load_bundle_manifest, verify_bundle_files
from export.int8_precision import exact_int8


class PairIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1)
    text_pair: str | None = None


class ClassifyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, min_length=1)
    text_pair: str | None = None
    inputs: list[PairIn] | None = None
    top_k: int | None = Field(None, ge=1)


class QAIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1)
    context: str = Field(min_length=1)
    top_k: int = Field(1, ge=1)
    max_answer_len: int | None = Field(None, ge=1)
    doc_stride: int | None = Field(None, ge=0)
    handle_impossible_answer: bool = False


@dataclass
class QASettings:
    """Window sizes; the old QA pipeline's defaults except max_answer_len (ours is 30, it had 15)."""

    max_seq_len: int = 384
    doc_stride: int = 128
    max_question_len: int = 64
    max_answer_len: int = 30
    n_best: int = 20


def qa_settings_from_bundle(bundle: str | Path) -> QASettings:
    """The bundle's window sizes, so both sides of a comparison cut contexts alike."""
    manifest = load_bundle_manifest(bundle)
    qa = {**DEFAULT_QA, **(manifest.qa_defaults or {})}
    return QASettings(manifest.max_seq_len, qa["doc_stride"], qa["max_query_len"], qa["max_answer_len"])


def _quiet_transformers() -> Any:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


class HFQuestionAnswering:
    """Extractive QA with `transformers` only: what pipeline("question-answering") used to do."""

    kind = "transformers AutoModelForQuestionAnswering + fast-tokenizer windows (HF course recipe)"

    def __init__(self, directory: str | Path, settings: QASettings | None = None):
        transformers = _quiet_transformers()
        self.settings = settings or QASettings()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
        self.model = transformers.AutoModelForQuestionAnswering.from_pretrained(str(directory)).eval()

    def __call__(
        self,
        question: str,
        context: str,
        top_k: int = 1,
        max_answer_len: int | None = None,
        doc_stride: int | None = None,
        handle_impossible_answer: bool = False,
    ) -> tuple[list[dict[str, Any]], int]:
        cfg = self.settings
        max_answer_len = max_answer_len or cfg.max_answer_len
        encoded = self.tokenizer(
            question,
            context,
            truncation="only_second",
            max_length=cfg.max_seq_len,
            stride=cfg.doc_stride if doc_stride is None else doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding="longest",
            return_tensors="pt",
        )
        offsets = encoded.pop("offset_mapping").numpy()
        encoded.pop("overflow_to_sample_mapping", None)
        start_all, end_all = self.forward(encoded)
        spans: dict[tuple[int, int], float] = {}
        null_logit = np.inf
        for window in range(len(start_all)):
            in_context = np.array([s == 1 for s in encoded.sequence_ids(window)])
            start, end = start_all[window], end_all[window]
            null_logit = min(null_logit, float(start[0] + end[0]))
            for i in np.argsort(start)[::-1][: cfg.n_best]:
                for j in np.argsort(end)[::-1][: cfg.n_best]:
                    if not (in_context[i] and in_context[j]) or j < i or j - i + 1 > max_answer_len:
                        continue
                    key = (int(offsets[window, i, 0]), int(offsets[window, j, 1]))
                    spans[key] = max(spans.get(key, -np.inf), float(start[i] + end[j]))
        ranked = sorted(spans.items(), key=lambda kv: -kv[1])[: max(cfg.n_best, top_k)]
        logits = np.array([v for _, v in ranked] + ([null_logit] if handle_impossible_answer else []))
        if len(logits) == 0:
            return [], len(start_all)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        answers = [
            {"text": context[s:e], "start": s, "end": e, "score": float(p)}
            for ((s, e), _), p in zip(ranked, probs, strict=False)
        ]
        if handle_impossible_answer:
            answers.append({"text": "", "start": 0, "end": 0, "score": float(probs[-1])})
            answers.sort(key=lambda a: -a["score"])
        return answers[:top_k], len(start_all)

    def forward(self, encoded) -> tuple[np.ndarray, np.ndarray]:
        """Start and end logits of all the request's windows, in one forward pass."""
        import torch

        with torch.inference_mode():
            output = self.model(**encoded)
        return output.start_logits.float().numpy(), output.end_logits.float().numpy()


def classify_response(request: ClassifyIn, ranked: list[list[tuple[str, float]]]) -> dict[str, Any]:
    """Our /classify response from each item's (label, score) pairs, best first."""
    results = []
    for pairs in ranked:
        scores = [{"label": label, "score": float(score)} for label, score in pairs][: request.top_k]
        top = {"label": scores[0]["label"], "score": scores[0]["score"], "scores": scores}
        results.append({**top, "value": None, "truncated": None, "windows": 1})
    return results[0] if request.inputs is None else {"results": results}


def build_app(title: str, info: dict[str, Any], classify, reader, what: str) -> FastAPI:
    """/ready and /models (the routes the benchmarks wait on and record), /classify over `classify`
    (items -> each item's (label, score) pairs, best first) and /qa over `reader`
    (HFQuestionAnswering or a subclass); a missing one answers 404."""
    app = FastAPI(title=title)
    app.state.info = info

    @app.get("/ready")
    def ready() -> dict[str, str]:
        return {"status": "ready"}  # models load before the server starts accepting requests

    @app.get("/models")
    def models() -> dict[str, Any]:
        return app.state.info

    def missing(task: str) -> HTTPException:
        return HTTPException(404, {"error": "no_model", "message": f"no {task} {what} loaded"})

    @app.post("/classify")
    def classify_endpoint(request: ClassifyIn) -> dict[str, Any]:
        if classify is None:
            raise missing("classify")
        if (request.inputs is None) == (request.text is None):
            raise HTTPException(422, "give either text or inputs")
        items = request.inputs or [PairIn(text=request.text or "", text_pair=request.text_pair)]
        return classify_response(request, classify(items))

    @app.post("/qa")
    def qa_endpoint(request: QAIn) -> dict[str, Any]:
        if reader is None:
            raise missing("qa")
        options = request.model_dump(exclude={"question", "context"})
        answers, windows = reader(request.question, request.context, **options)
        return {"answers": answers, "windows": windows}

    return app


def create_app(
    classify: str | Path | None = None,
    qa: str | Path | None = None,
    *,
    classify_max_length: int | None = None,
    qa_settings: QASettings | None = None,
) -> FastAPI:
    """Load the given checkpoints now (startup blocks until they are loaded) and serve them."""
    if not (classify or qa):
        raise ValueError("give at least one checkpoint directory (classify or qa)")
    import torch

    transformers = _quiet_transformers()
    pipe = transformers.pipeline("text-classification", model=str(classify), device=-1) if classify else None
    reader = HFQuestionAnswering(qa, qa_settings) if qa else None
    max_length = classify_max_length or (pipe.tokenizer.model_max_length if pipe else None)

    def classifier(items: list[PairIn]) -> list[list[tuple[str, float]]]:
        calls = [{"text": i.text, "text_pair": i.text_pair} if i.text_pair else i.text for i in items]
        outputs = pipe(calls, top_k=None, truncation=True, max_length=max_length)
        return [[(s["label"], s["score"]) for s in scores] for scores in outputs]

    info = {
        "classify": str(classify) if classify else None,
        "qa": str(qa) if qa else None,
        "qa_kind": reader.kind if reader else None,
        "classify_max_length": max_length,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
    }
    return build_app("transformers pipeline baseline", info, classify and classifier, reader, "checkpoint")


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
        exact_int8(options, variant=self.variant)
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
        return tuple(self.model.run(encoded))  # type: ignore[return-value]


def create_ort_app(
    classify: str | Path | None = None, qa: str | Path | None = None, *, variant: str | None, threads: int
) -> FastAPI:
    """The plain ONNX Runtime server on bundles: see the module's docstring."""
    if not (classify or qa):
        raise ValueError("give at least one bundle directory (classify or qa)")
    model = OrtModel(classify, variant, threads) if classify else None
    reader = OrtQuestionAnswering(OrtModel(qa, variant, threads), qa) if qa else None

    def classifier(items: list[PairIn]) -> list[list[tuple[str, float]]]:
        cut = {"truncation": True, "max_length": model.manifest.max_seq_len}
        rows = [model.tokenizer(i.text, i.text_pair, **cut) for i in items]
        logits = model.run(model.tokenizer.pad(rows, return_tensors="np"))[0]
        probabilities = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        labels = model.manifest.labels or []
        return [[(labels[k], row[k]) for k in np.argsort(row)[::-1]] for row in probabilities]

    info = {
        "classify": str(classify) if classify else None,
        "qa": str(qa) if qa else None,
        "variant": (model or reader.model).variant,  # type: ignore[union-attr]
        "intra_op_threads": threads,
    }
    return build_app("plain ONNX Runtime server", info, classify and classifier, reader, "bundle")


def serve(app: FastAPI, what: str, port: int) -> int:
    import uvicorn

    print(f"{what} serving {app.state.info} on 127.0.0.1:{port} (pid {os.getpid()})", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port)  # uvicorn defaults, access log included
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classify", help="text-classification checkpoint directory (--ort: bundle)")
    p.add_argument("--qa", help="question-answering checkpoint directory (--ort: bundle)")
    p.add_argument("--bundle", help="cut inputs as this bundle does (max_seq_len, QA windows)")
    p.add_argument("--ort", action="store_true", help="the plain ORT server on bundles")
    p.add_argument("--variant", help="--ort: the bundle variant (default: the one our server picks)")
    p.add_argument("--port", type=int, default=8001)
    args = p.parse_args(argv)
    if args.ort and (args.classify or args.qa):
        app = create_ort_app(args.classify, args.qa, variant=args.variant, threads=0)
        return serve(app, "plain ORT", args.port)
    for flag in ("classify", "qa"):
        value = getattr(args, flag)
        if value and not (Path(value) / "config.json").is_file():
            p.error(f"--{flag} {value}: no config.json there (expected a Hugging Face checkpoint directory)")
    if not (args.classify or args.qa):
        p.error("give at least one of --classify, --qa")
    settings = qa_settings_from_bundle(args.bundle) if args.bundle else QASettings()
    length = settings.max_seq_len if args.bundle else None
    app = create_app(args.classify, args.qa, classify_max_length=length, qa_settings=settings)
    return serve(app, "pipeline baseline", args.port)


if __name__ == "__main__":
    sys.exit(main())
