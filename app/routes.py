"""HTTP routes: thin wrappers that lease the model's serving version, time it and shape the response."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from .errors import CLIENT_CLOSED, MODELS_RESPONSES, NOT_READY, TASK_RESPONSES
from .middleware import MODEL_SCOPE_KEY
from .model_listing import list_models
from .request_errors import Unauthorized
from .schemas import (
    ChoiceRequest,
    ChoiceResponse,
    ClassifyBatchResponse,
    ClassifyRequest,
    ClassifyResult,
    HealthResponse,
    ModelsResponse,
    NERRequest,
    NERResponse,
    QARequest,
    QAResponse,
    ReadyResponse,
)
from .services import ChoiceService, ClassifyService, NERService, QAService, TaskService, Timings, service_of

router = APIRouter()


def state_of(request: Request) -> Any:
    return request.app.state.service_state


def check_bearer(request: Request, key: SecretStr, what: str) -> None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the comparison time must not reveal how much of the key matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode("utf-8"), key.get_secret_value().encode("utf-8")
    ):
        raise Unauthorized(f"missing or invalid {what}: send 'Authorization: Bearer <key>'")


async def require_api_key(request: Request) -> None:
    key = state_of(request).settings.api_key
    if key is not None:
        check_bearer(request, key, "API key")


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def serve(request: Request, response: Response, kind: type[TaskService], body: Any) -> Any:
    """Run `body` on the service of type `kind` (its task's) of the model the request picks."""
    state = state_of(request)
    task = kind.task
    # The version serving now answers the whole request, even if a new one is swapped in meanwhile.
    with state.registry.lease(task, body.model) as bundle:
        request.scope[MODEL_SCOPE_KEY] = bundle.name
        timings = Timings()
        work = asyncio.ensure_future(service_of(bundle, kind)(body, timings))
        watcher = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                work.cancel()  # client gone (or we were cancelled): its queued work is dropped
            watcher.cancel()
        if not work.done() or work.cancelled():
            return Response(status_code=CLIENT_CLOSED)
        result = work.result()
    timings.observe(state.metrics, task, bundle.name)
    response.headers["Server-Timing"] = timings.header()
    response.headers["X-Model"] = bundle.name
    response.headers["X-Model-Version"] = bundle.version
    return result


@router.post(
    "/classify",
    response_model=ClassifyResult | ClassifyBatchResponse,
    responses=TASK_RESPONSES,
    dependencies=[Depends(require_api_key)],
    summary="Classify a text, a text pair, or a batch",
)
async def classify(body: ClassifyRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, ClassifyService, body)


@router.post(
    "/ner",
    response_model=NERResponse,
    responses=TASK_RESPONSES,
    dependencies=[Depends(require_api_key)],
    summary="Named entities with character offsets",
)
async def ner(body: NERRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, NERService, body)


@router.post(
    "/multiple-choice",
    response_model=ChoiceResponse,
    responses=TASK_RESPONSES,
    dependencies=[Depends(require_api_key)],
    summary="Pick the best of several choices",
)
async def multiple_choice(body: ChoiceRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, ChoiceService, body)


@router.post(
    "/qa",
    response_model=QAResponse,
    responses=TASK_RESPONSES,
    dependencies=[Depends(require_api_key)],
    summary="Extractive question answering over a context of any length",
)
async def qa(body: QARequest, request: Request, response: Response) -> Any:
    return await serve(request, response, QAService, body)


@router.get("/health", response_model=HealthResponse, summary="Liveness: the process answers")
async def health() -> HealthResponse:
    return HealthResponse()


@router.get(
    "/ready",
    response_model=ReadyResponse,
    responses={NOT_READY: {"model": ReadyResponse}},
    summary="Readiness: every bundle loaded and warmed, and not shutting down",
)
async def ready(request: Request) -> JSONResponse:
    state = state_of(request)
    is_ready, status, models, errors = state.registry.readiness()
    if state.shutting_down:
        is_ready, status = False, "shutting_down"
    body = ReadyResponse(ready=is_ready, status=status, models=models, errors=errors)
    return JSONResponse(body.model_dump(), status_code=200 if is_ready else NOT_READY)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    registry = state_of(request).metrics
    return Response(registry.render(), media_type=registry.content_type)


@router.get(
    "/models",
    response_model=ModelsResponse,
    dependencies=[Depends(require_api_key)],
    responses=MODELS_RESPONSES,
    summary="Every model: task, labels, version, status, memory, variant, execution provider and limits",
)
async def models(request: Request) -> ModelsResponse:
    return list_models(state_of(request).registry)
