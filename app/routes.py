"""HTTP routes: thin wrappers that lease the model's serving version, time it and shape the response."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from .errors import ApiError
from .loader import MB
from .middleware import MODEL_SCOPE_KEY
from .registry import Model
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
    VersionInfo,
)
from .services import Timings

router = APIRouter()

CLIENT_CLOSED = 499  # nginx's code for "client closed the request"; only ever seen in logs and metrics
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "Body is not UTF-8 JSON",
        401: "Missing or wrong API key",
        404: "No model of that name, or none serves this task (`no_model`)",
        413: "Body or text too large",
        422: "Invalid request (the `fields` list names each problem); `model_required` when several "
        "models serve the task and none is its default",
        429: "Queue full; retry after Retry-After seconds",
        503: "Model loading, failed, or shutting down",
    }.items()
}


def state_of(request: Request) -> Any:
    return request.app.state.service_state


def check_bearer(request: Request, key: SecretStr, what: str) -> None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the comparison time must not reveal how much of the key matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode("utf-8"), key.get_secret_value().encode("utf-8")
    ):
        raise ApiError(
            401,
            "unauthorized",
            f"missing or invalid {what}: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def require_api_key(request: Request) -> None:
    key = state_of(request).settings.api_key
    if key is not None:
        check_bearer(request, key, "API key")


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def serve(request: Request, response: Response, task: str, body: Any) -> Any:
    state = state_of(request)
    # The version serving now answers the whole request, even if a new one is swapped in meanwhile.
    with state.registry.lease(task, body.model) as bundle:
        request.scope[MODEL_SCOPE_KEY] = bundle.name
        timings = Timings()
        work = asyncio.ensure_future(bundle.service(body, timings))
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
    summary="Every model: task, labels, version, status, memory, variant, execution provider and limits",
)
async def models(request: Request) -> ModelsResponse:
    state = state_of(request)
    infos = [model_info(state, model) for model in state.registry.models.values()]
    used = [i.memory_mb for i in infos if i.memory_mb is not None and i.status == "ready"]
    return ModelsResponse(
        models=infos,
        memory_mb=round(sum(used), 1) if used else None,
        max_models_memory_mb=state.settings.max_models_memory_mb,
    )


def model_info(state: Any, model: Model) -> ModelInfo:
    """What /models (and the admin API) say about one model and its serving version."""
    settings = state.settings
    limits: dict[str, int | float | str] = {
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
    bundle = model.current
    info = ModelInfo(
        name=model.name,
        task=model.task,
        status=model.status,
        error=model.error,
        default=model.task is not None and state.registry.default_name(model.task) == model.name,
        versions=[VersionInfo(**vars(event)) for event in model.history],
        limits=limits,
    )
    if bundle is None:
        return info
    manifest, runtime, batcher = bundle.manifest, bundle.runtime, bundle.batcher
    if batcher is not None:  # the limits in force, device-dependent defaults resolved
        limits.update(
            max_batch_tokens=batcher.max_batch_tokens, max_padding_factor=batcher.max_padding_factor
        )
    return info.model_copy(
        update=dict(
            path=str(bundle.path),
            version=bundle.version,
            digest=bundle.digest,
            memory_mb=None if bundle.memory_bytes is None else round(bundle.memory_bytes / MB, 1),
            in_flight=bundle.leases,
            labels=manifest.labels,
            problem_type=manifest.problem_type,
            variant=bundle.variant,
            precision=manifest.variants[bundle.variant].precision if bundle.variant else None,
            device=bundle.device,
            execution_provider=runtime.provider if runtime else None,
            providers=runtime.providers if runtime else [],
            intra_op_threads=bundle.threads,
            instances=runtime.instances if runtime else None,
            max_seq_len=manifest.max_seq_len,
            qa_defaults=manifest.qa_defaults if manifest.task == "qa" else None,
            load_seconds=bundle.load_seconds,
            limits=limits,
        )
    )
