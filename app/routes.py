"""HTTP routes: thin wrappers that find the task's service, time it and shape the response."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from export.bundle import VARIANT_NOTES, batch_invariant

from .errors import ApiError
from .schemas import (
    ChoiceRequest,
    ChoiceResponse,
    ClassifyBatchResponse,
    ClassifyRequest,
    ClassifyResult,
    ErrorResponse,
    HealthResponse,
    ModelInfo,
    ModelsResponse,
    NERRequest,
    NERResponse,
    QARequest,
    QAResponse,
    ReadyResponse,
)
from .services import Timings

router = APIRouter()

CLIENT_CLOSED = 499  # nginx's code for "client closed the request"; only ever seen in logs and metrics
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "Body is not UTF-8 JSON",
        401: "Missing or wrong API key",
        404: "No bundle serves this task",
        413: "Body or text too large",
        422: "Invalid request (the `fields` list names each problem)",
        429: "Queue full; retry after Retry-After seconds",
        503: "Model loading, failed, or shutting down",
    }.items()
}


def state_of(request: Request) -> Any:
    return request.app.state.service_state


async def require_api_key(request: Request) -> None:
    key = state_of(request).settings.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the comparison time must not reveal how much of the key matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode("utf-8"), key.get_secret_value().encode("utf-8")
    ):
        raise ApiError(
            401,
            "unauthorized",
            "missing or invalid API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def serve(request: Request, response: Response, task: str, body: Any) -> Any:
    state = state_of(request)
    service = state.registry.service(task)
    timings = Timings()
    work = asyncio.ensure_future(service(body, timings))
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
    timings.observe(state.metrics, task)
    response.headers["Server-Timing"] = timings.header()
    return result


@router.post(
    "/classify",
    response_model=ClassifyResult | ClassifyBatchResponse,
    responses=ERRORS,
    dependencies=[Depends(require_api_key)],
    summary="Classify a text, a text pair, or a batch",
)
async def classify(body: ClassifyRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, "classify", body)


@router.post(
    "/ner",
    response_model=NERResponse,
    responses=ERRORS,
    dependencies=[Depends(require_api_key)],
    summary="Named entities with character offsets",
)
async def ner(body: NERRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, "ner", body)


@router.post(
    "/multiple-choice",
    response_model=ChoiceResponse,
    responses=ERRORS,
    dependencies=[Depends(require_api_key)],
    summary="Pick the best of several choices",
)
async def multiple_choice(body: ChoiceRequest, request: Request, response: Response) -> Any:
    return await serve(request, response, "multiple-choice", body)


@router.post(
    "/qa",
    response_model=QAResponse,
    responses=ERRORS,
    dependencies=[Depends(require_api_key)],
    summary="Extractive question answering over a context of any length",
)
async def qa(body: QARequest, request: Request, response: Response) -> Any:
    return await serve(request, response, "qa", body)


@router.get("/health", response_model=HealthResponse, summary="Liveness: the process answers")
async def health() -> HealthResponse:
    return HealthResponse()


@router.get(
    "/ready",
    response_model=ReadyResponse,
    responses={503: {"model": ReadyResponse}},
    summary="Readiness: every bundle loaded and warmed, and not shutting down",
)
async def ready(request: Request) -> JSONResponse:
    state = state_of(request)
    is_ready, status, models, errors = state.registry.readiness()
    if state.shutting_down:
        is_ready, status = False, "shutting_down"
    body = ReadyResponse(ready=is_ready, status=status, models=models, errors=errors)
    return JSONResponse(body.model_dump(), status_code=200 if is_ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    registry = state_of(request).metrics
    return Response(registry.render(), media_type=registry.content_type)


@router.get(
    "/models",
    response_model=ModelsResponse,
    dependencies=[Depends(require_api_key)],
    responses={401: ERRORS[401]},
    summary="Bundles, their variant, execution provider and limits",
)
async def models(request: Request) -> ModelsResponse:
    state = state_of(request)
    settings = state.settings
    limits = {
        "max_batch_size": settings.max_batch_size,
        "max_wait_ms": settings.max_wait_ms,
        "max_queue": settings.max_queue,
        "max_in_flight": settings.max_in_flight,
        "max_body_bytes": settings.max_body_bytes,
        "max_text_chars": settings.max_text_chars,
        "max_qa_context_chars": settings.max_qa_context_chars,
        "max_batch_items": settings.max_batch_items,
        "max_choices": settings.max_choices,
        "classify_long_text": settings.classify_long_text,
    }
    out = []
    for bundle in state.registry.bundles:
        manifest, runtime, batcher = bundle.manifest, bundle.runtime, bundle.batcher
        # The limits in force, device-dependent defaults resolved.
        resolved = (
            {"max_batch_tokens": batcher.max_batch_tokens, "max_padding_factor": batcher.max_padding_factor}
            if batcher is not None
            else {}
        )
        out.append(
            ModelInfo(
                name=bundle.name,
                path=str(bundle.path),
                task=bundle.task,
                status=bundle.status,
                error=bundle.error,
                labels=manifest.labels if manifest else None,
                problem_type=manifest.problem_type if manifest else None,
                variant=bundle.variant,
                precision=manifest.variants[bundle.variant].precision
                if manifest and bundle.variant
                else None,
                batch_invariant=batch_invariant(bundle.variant, bundle.device) if bundle.variant else None,
                variant_note=VARIANT_NOTES.get(bundle.variant) if bundle.variant else None,
                device=bundle.device,
                execution_provider=runtime.provider if runtime else None,
                providers=runtime.providers if runtime else [],
                intra_op_threads=bundle.threads,
                instances=runtime.instances if runtime else None,
                max_seq_len=manifest.max_seq_len if manifest else None,
                qa_defaults=manifest.qa_defaults if manifest and manifest.task == "qa" else None,
                limits={**limits, **resolved},
                load_seconds=bundle.load_seconds,
            )
        )
    return ModelsResponse(models=out)
