"""HTTP routes: thin wrappers that lease the model's serving version, time it and shape the response.

Each task's POST route is written out with its request schema; tests/test_tasks.py checks that
path, schemas and summary match the task's registry declaration (processing/tasks.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter

from app.api.cache import Entry, Key, canonical
from app.api.cohere_schemas import InfinityRerankRequest, InfinityRerankResponse
from app.api.error_table import CLIENT_CLOSED, MODELS_RESPONSES, NOT_READY, TASK_RESPONSES, TOKENIZE_RESPONSES
from app.api.headers import long_input_headers, timing_headers
from app.api.lean_route import LeanRoute
from app.api.listing import list_models, openai_model_list
from app.api.middleware import MODEL_SCOPE_KEY, bearer_matches
from app.api.native_schemas import (
    ChoiceRequest,
    ChoiceResponse,
    ClassifyBatchResponse,
    ClassifyRequest,
    ClassifyResult,
    NERRequest,
    NERResponse,
    QARequest,
    QAResponse,
)
from app.api.openai_schemas import OpenAIEmbeddingRequest, OpenAIEmbeddingResponse, OpenAIModelList
from app.api.scheduling import schedule_for
from app.api.service_schemas import HealthResponse, ModelsResponse, ReadyResponse, TokenizeRequest, TokenOut
from app.api.serving import rerank_service
from app.api.serving.embed_service import EmbedService
from app.api.serving.services import (
    ChoiceService,
    ClassifyService,
    NERService,
    QAService,
    service_of,
    tokenize_texts,
)
from app.api.serving.sparse_service import SparseEmbedService
from app.api.serving.task_service import TaskService, Timings
from app.api.tei_schemas import (
    EmbedAllResponse,
    EmbedRequest,
    EmbedResponse,
    EmbedTextsRequest,
    PredictRequest,
    PredictResponse,
    RerankRequest,
    RerankResponse,
    SimilarityRequest,
    SimilarityResponse,
    SparseEmbedResponse,
)
from app.engine.batch_types import Schedule
from app.errors import hide_paths
from processing.tasks import TASKS

if TYPE_CHECKING:
    from app.engine.table import Bundle

# Every route of `router` needs the API key when one is set, checked by AuthMiddleware from the
# headers before the body is read (app/api/middleware.py). Its task routes skip FastAPI's generic
# request handling in the plain case (app/api/lean_route.py).
# `open_router`: liveness, readiness and metrics, never behind the key.
router = APIRouter(route_class=LeanRoute)
open_router = APIRouter()


def state_of(request: Request) -> Any:
    return request.app.state.service_state


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def serve(
    request: Request,
    response: Response,
    kind: type[TaskService],
    body: Any,
    call: Callable[..., Awaitable[Any]] | None = None,
) -> Any:
    """Run `body` on the service of type `kind` (its task's) of the model the request picks: the
    service itself, or `call(service, body, timings)` (a protocol adapter's method of it)."""
    # Every task request has `timeout_ms` and `priority` (native_schemas.Request); a body without them
    # is scheduled by its headers alone.
    schedule = schedule_for(
        request.headers,
        getattr(body, "timeout_ms", None),
        getattr(body, "priority", None),
        state_of(request).settings.max_queue_ms,
    )

    async def work(bundle: Bundle, timings: Timings) -> Any:
        service = service_of(bundle, kind)
        return await (call(service, body, timings) if call else service(body, timings))

    cache_as = canonical(body) if state_of(request).cache is not None else None
    return await run_leased(request, response, kind.task, body.model, work, schedule, cache_as=cache_as)


async def run_leased(
    request: Request,
    response: Response,
    task: str | None,
    model: str | None,
    work: Callable[[Bundle, Timings], Awaitable[Any]],
    schedule: Schedule | None = None,
    version: str | None = None,
    cache_as: str | None = None,
) -> Any:
    """Run `work` on the version serving `model` (of `task`, if given; or the task's default) under the
    request's schedule; drop it if the client goes away. With `version`, only that version may serve.
    With `cache_as` (the request in canonical form) and RESPONSE_CACHE_MB, the answer comes from, or
    goes to, the response cache."""
    state = state_of(request)
    cache = state.cache if cache_as is not None else None
    # The version serving now answers the whole request, even if a new one is swapped in meanwhile.
    with state.registry.lease(task, model, version) as bundle:
        request.scope[MODEL_SCOPE_KEY] = bundle.name
        if cache is not None:
            assert cache_as is not None
            key = Key(bundle.name, bundle.version, request.url.path, cache_as)
            hit = cache.get(key)
            if hit is not None:
                response.raw_headers.extend(answer_headers(bundle, dict(hit.headers)))
                return cached(response, hit, "hit")
        timings = Timings(schedule)
        work_task = asyncio.ensure_future(work(bundle, timings))
        watcher = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work_task.done():
                work_task.cancel()  # client gone (or we were cancelled): its queued work is dropped
            watcher.cancel()
        if not work_task.done() or work_task.cancelled():
            return Response(status_code=CLIENT_CLOSED)
        result = work_task.result()
    timings.observe(state.metrics, bundle.task, bundle.name)
    # Inference (not /tokenize) gets text-embeddings-inference's timing headers too. Raw pairs, one
    # extend: setting them one by one through response.headers scans the list for each.
    extra = long_input_headers(timings)
    response.raw_headers.extend(timing_headers(timings, tei=task is not None) + answer_headers(bundle, extra))
    if cache is None:
        return result
    entry = Entry(serialized(request, result), tuple(extra.items()))
    # Only a version still in service stores: a swapped-out one's entries are already dropped.
    if getattr(state.registry.models.get(bundle.name), "current", None) is bundle:
        cache.put(key, entry)
    return cached(response, entry, "miss")


def answer_headers(bundle: Bundle, extra: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """X-Model, X-Model-Version and the answer's own headers, as raw ASGI pairs."""
    name, version = bundle.name.encode("latin-1"), bundle.version.encode("latin-1")
    own = [(key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in extra.items()]
    return [(b"x-model", name), (b"x-model-version", version), *own]


def cached(response: Response, entry: Entry, outcome: str) -> Response:
    """A cacheable answer, as the serialized bytes FastAPI would send, with `X-Cache: hit|miss`."""
    response.headers["X-Cache"] = outcome
    return Response(entry.body, media_type="application/json", headers=dict(response.headers))


@functools.cache
def adapter(response_model: Any) -> TypeAdapter[Any]:
    return TypeAdapter(response_model)


def serialized(request: Request, result: Any) -> bytes:
    """`result` as JSON through its route's response model, as FastAPI serializes it."""
    return adapter(request.scope["route"].response_model).dump_json(result, by_alias=True)


# The task routes. Path, schemas and summary are the task's registry declaration (processing/tasks.py).


@router.post(
    "/classify",
    response_model=ClassifyResult | ClassifyBatchResponse,
    summary=TASKS["classify"].summary,
    responses=TASK_RESPONSES,
)
async def classify(body: ClassifyRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, ClassifyService, body)


@router.post(
    "/ner",
    response_model=NERResponse,
    summary=TASKS["ner"].summary,
    responses=TASK_RESPONSES,
)
async def ner(body: NERRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, NERService, body)


@router.post(
    "/multiple-choice",
    response_model=ChoiceResponse,
    summary=TASKS["multiple-choice"].summary,
    responses=TASK_RESPONSES,
)
async def multiple_choice(body: ChoiceRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, ChoiceService, body)


@router.post("/qa", response_model=QAResponse, summary=TASKS["qa"].summary, responses=TASK_RESPONSES)
async def qa(body: QARequest, request: Request, response: Response) -> Any:
    return await serve(request, response, QAService, body)


@router.post(
    "/embed",
    response_model=EmbedResponse,
    summary=TASKS["embed"].summary,
    responses=TASK_RESPONSES,
)
async def embed(body: EmbedRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, EmbedService, body)


@router.post(
    "/embed_sparse",
    response_model=SparseEmbedResponse,
    summary=TASKS["sparse"].summary,
    responses=TASK_RESPONSES,
)
async def embed_sparse(body: EmbedTextsRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, SparseEmbedService, body)


@router.post(
    "/embed_all",
    response_model=EmbedAllResponse,
    summary="A vector per token, for late interaction (text-embeddings-inference's /embed_all)",
    responses=TASK_RESPONSES,
)
async def embed_all(body: EmbedTextsRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, EmbedService, body, EmbedService.embed_all)


@router.post(
    "/tokenize",
    response_model=list[list[TokenOut]],
    responses=TOKENIZE_RESPONSES,
    summary="Tokens with ids and character offsets, from a model's tokenizer (TEI's /tokenize)",
)
async def tokenize(body: TokenizeRequest, request: Request, response: Response) -> Any:
    model = body.model or state_of(request).registry.shared_tokenizer_model()
    settings = state_of(request).settings
    return await run_leased(
        request, response, None, model, lambda bundle, _: tokenize_texts(bundle, body, settings)
    )


def readiness(state: Any) -> tuple[bool, str, dict[str, str], dict[str, str]]:
    """The registry's readiness, and never ready while shutting down (/ready, /v2/health/ready, gRPC's
    ServerReady); `state` is the app's ServiceState."""
    is_ready, status, models, errors = state.registry.readiness()
    if state.shutting_down:
        is_ready, status = False, "shutting_down"
    return is_ready, status, models, errors


# Other protocols' routes onto a registry task's service: OpenAI's and TEI's embedding endpoints.
@router.post(
    "/v1/embeddings",
    response_model=OpenAIEmbeddingResponse,
    responses=TASK_RESPONSES,
    summary="Sentence embeddings, OpenAI-compatible (float or base64, with token usage)",
)
@router.post(
    "/embeddings",
    response_model=OpenAIEmbeddingResponse,
    responses=TASK_RESPONSES,
    summary="The same as /v1/embeddings, where TEI serves it too (an OpenAI client's base URL without /v1)",
)
async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request, response: Response) -> Any:
    # OpenAI's own model names, which its clients send unless told otherwise (LangChain's
    # OpenAIEmbeddings: text-embedding-ada-002), get the embedding default; the answer's `model` says
    # which served. Any other unknown name is 404 no_model, as on every route.
    known = state_of(request).registry.models
    if body.model is not None and body.model.startswith("text-embedding-") and body.model not in known:
        body = body.model_copy(update={"model": None})
    return await serve(request, response, EmbedService, body, EmbedService.openai)


@router.post(
    "/similarity",
    response_model=SimilarityResponse,
    responses=TASK_RESPONSES,
    summary="Cosine similarity of a source sentence with each of a list (text-embeddings-inference's)",
)
async def similarity(body: SimilarityRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, EmbedService, body, EmbedService.similarity)


# Reranking and TEI's /predict onto the classify service (app/api/serving/rerank_service.py). A rerank
# request without `model` gets the reranker the registry picks (Registry.reranker).
@router.post(
    "/rerank",
    response_model=RerankResponse,
    response_model_exclude_none=True,
    responses=TASK_RESPONSES,
    summary="Texts ranked by relevance to a query, by a pair classifier (text-embeddings-inference's)",
)
async def rerank(body: RerankRequest, request: Request, response: Response) -> Any:
    body = body.model_copy(update={"model": state_of(request).registry.reranker(body.model)})
    return await serve(request, response, ClassifyService, body, rerank_service.rerank)


@router.post(
    "/v1/rerank",
    response_model=InfinityRerankResponse,
    responses=TASK_RESPONSES,
    summary="Documents ranked by relevance to a query (Infinity's and Cohere's shape, with top_n and usage)",
)
async def infinity_rerank(body: InfinityRerankRequest, request: Request, response: Response) -> Any:
    body = body.model_copy(update={"model": state_of(request).registry.reranker(body.model)})
    return await serve(request, response, ClassifyService, body, rerank_service.infinity_rerank)


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses=TASK_RESPONSES,
    summary="Every label's score for a text, a pair or a batch (text-embeddings-inference's /predict)",
)
async def predict(body: PredictRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, ClassifyService, body, rerank_service.predict)


@open_router.get("/health", response_model=HealthResponse, summary="Liveness: the process answers")
async def health() -> HealthResponse:
    return HealthResponse()


@open_router.get(
    "/ready",
    response_model=ReadyResponse,
    responses={NOT_READY: {"model": ReadyResponse}},
    summary="Readiness: every bundle loaded and warmed, and not shutting down",
)
async def ready(request: Request) -> JSONResponse:
    is_ready, status, models, errors = readiness(state_of(request))
    # Why a model failed is for operators: with API_KEY set, only a caller with the key reads it
    # (the logs have it all); a probe learns ready or not, and each model's status.
    settings = state_of(request).settings
    if settings.api_key is not None and not bearer_matches(request.scope, settings.api_key):
        errors = {}
    errors = {name: hide_paths(error, settings.models_dir) or "" for name, error in errors.items()}
    body = ReadyResponse(ready=is_ready, status=status, models=models, errors=errors)
    return JSONResponse(body.model_dump(), status_code=200 if is_ready else NOT_READY)


@open_router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    registry = state_of(request).metrics
    return Response(registry.render(), media_type=registry.content_type)


@router.get(
    "/models",
    response_model=ModelsResponse,
    responses=MODELS_RESPONSES,
    summary="Every model: task, labels, version, status, memory, variant, execution provider and limits",
)
async def models(request: Request) -> ModelsResponse:
    return list_models(state_of(request).registry)


@router.get(
    "/v1/models",
    response_model=OpenAIModelList,
    responses=MODELS_RESPONSES,
    summary="The models serving now, as OpenAI's model list (for OpenAI clients)",
)
async def openai_models(request: Request) -> OpenAIModelList:
    return openai_model_list(state_of(request).registry)
