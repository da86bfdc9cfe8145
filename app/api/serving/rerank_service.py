"""Other protocols' routes onto the classify service: reranking as text-embeddings-inference
(/rerank) and Infinity (/v1/rerank) speak it, and TEI's /predict. Every input goes through
ClassifyService.classify as /classify's do: the same batches, limits, truncation and numbers; here
only the answer's shape and the relevance score are made (processing/classify.py)."""

from __future__ import annotations

import time
import uuid

from app.api.cohere_schemas import InfinityRerankRequest, InfinityRerankResponse, RerankResult
from app.api.openai_schemas import EmbeddingUsage
from app.api.serving.services import Classified, ClassifyService
from app.api.serving.task_service import Timings
from app.api.tei_schemas import (
    Prediction,
    PredictRequest,
    PredictResponse,
    Rank,
    RerankRequest,
    RerankResponse,
)
from app.errors import NotAReranker
from app.observe.logs import request_id_var
from processing import classify as classify_proc


def check_ranker(service: ClassifyService) -> None:
    """A relevance score needs one output (a logit or value) or two labels (relevant or not)."""
    if not service.regression and len(service.labels) != 2:
        raise NotAReranker(
            f"model {service.bundle.name!r} has {len(service.labels)} labels ({', '.join(service.labels)}) "
            "and gives no relevance score: reranking needs a classify model of text pairs with one output "
            "or two labels; name one in 'model'"
        )


def note(done: list[Classified], timings: Timings) -> None:
    """What happened to long inputs, for the protocol's headers."""
    timings.truncated = [i for i, c in enumerate(done) if c.truncated]
    timings.windows = {i: c.result.windows for i, c in enumerate(done) if c.result.windows > 1}


async def rank(
    service: ClassifyService,
    query: str,
    texts: list[str],
    field: str,
    timings: Timings,
    raw: bool,
    truncate: bool | None = None,
) -> tuple[list[int], list[float], list[Classified]]:
    """Each (query, text) pair's relevance; the texts' indices by decreasing relevance (ties keep
    their order)."""
    check_ranker(service)
    service.check_count(len(texts), field)
    pairs: list[tuple[str, str | None]] = [(query, text) for text in texts]
    names = [("query", f"{field}.{n}") for n in range(len(texts))]
    done = await service.classify(pairs, names, timings, truncate=truncate)
    scores = [classify_proc.relevance(c.result, c.logits, service.labels, raw) for c in done]
    return sorted(range(len(scores)), key=lambda i: -scores[i]), scores, done


async def rerank(service: ClassifyService, request: RerankRequest, timings: Timings) -> RerankResponse:
    """TEI's /rerank."""
    order, scores, done = await rank(
        service, request.query, request.texts, "texts", timings, request.raw_scores, request.truncate
    )
    text = request.texts if request.return_text else [None] * len(request.texts)
    reply = RerankResponse([Rank(index=i, score=scores[i], text=text[i]) for i in order])
    note(done, timings)
    return reply


async def infinity_rerank(
    service: ClassifyService, request: InfinityRerankRequest, timings: Timings
) -> InfinityRerankResponse:
    """Infinity's /v1/rerank: Cohere's answer, with usage."""
    order, scores, done = await rank(
        service, request.query, request.documents, "documents", timings, request.raw_scores
    )
    documents = request.documents if request.return_documents else [None] * len(request.documents)
    tokens = sum(c.tokens for c in done)
    reply = InfinityRerankResponse(
        results=[
            RerankResult(relevance_score=scores[i], index=i, document=documents[i])
            for i in order[: request.top_n]
        ],
        model=service.bundle.name,
        usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
        id=f"rerank-{request_id_var.get() or uuid.uuid4().hex}",
        created=int(time.time()),
    )
    note(done, timings)
    return reply


async def predict(service: ClassifyService, request: PredictRequest, timings: Timings) -> PredictResponse:
    """TEI's /predict: every label's score (or the top_k best), best first, per input."""
    pairs, names = request.sequences()
    service.check_count(len(pairs), "inputs")
    service.check_top_k(request.top_k)
    done = await service.classify(pairs, names, timings, truncate=request.truncate)
    rows = []
    for c in done:
        raw = request.raw_scores and c.result.value is None  # a regression's value is already raw
        scores = classify_proc.label_logits(c.logits, service.labels) if raw else c.result.scores
        rows.append([Prediction(score=s.score, label=s.label) for s in scores][: request.top_k])
    reply = PredictResponse(rows if request.batch else rows[0])
    note(done, timings)
    return reply
