"""The Open Inference Protocol's HTTP/REST routes (KServe V2, Triton): health, metadata and
inference for every model, whatever its task. The tensors <-> task mapping is app/api/v2.py; errors get
the protocol's {"error": message} body from app/api/error_table.py, as every route under /v2 does."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import Message

from app.api import v2, v2_binary
from app.api.error_table import NOT_READY, V2_RESPONSES
from app.api.routes import readiness, run_leased, state_of
from app.api.scheduling import schedule_for
from app.api.serving.task_service import Timings
from app.api.v2_schemas import (
    V2InferRequest,
    V2InferResponse,
    V2Live,
    V2ModelMetadata,
    V2ModelReady,
    V2Ready,
    V2ServerMetadata,
)
from processing.tasks import TASKS

if TYPE_CHECKING:
    from app.engine.table import Bundle


class JSONBodyRoute(APIRoute):
    """The protocol's request body is JSON whatever its Content-Type says, as Triton reads it:
    Triton's own client sends none, and `curl -d` a form's. With `Inference-Header-Content-Length`
    only that JSON header is parsed here; the binary data after it waits in the scope for the route."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def read_as_json(request: Request) -> Response:
            headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
            request.scope["headers"] = [*headers, (b"content-type", b"application/json")]
            receive = request.receive
            header_length = request.headers.get(v2_binary.HEADER)
            if header_length is not None and request.method == "POST":
                header, request.scope[v2_binary.SCOPE_KEY] = v2_binary.split_body(
                    await request.body(), header_length
                )

                replayed = False

                async def receive() -> Message:
                    nonlocal replayed
                    if replayed:  # after the body: wait for the disconnect, as the server would
                        return await request.receive()
                    replayed = True
                    return {"type": "http.request", "body": header, "more_body": False}

            return await handler(Request(request.scope, receive))

        return read_as_json


router = APIRouter(prefix="/v2", tags=["KServe V2 / Open Inference Protocol"], route_class=JSONBodyRoute)
model_routes = {"responses": V2_RESPONSES}  # behind the key: AuthMiddleware


@router.get("", response_model=V2ServerMetadata, summary="Server metadata: name, version, extensions")
async def server_metadata(request: Request) -> V2ServerMetadata:
    return V2ServerMetadata(name=v2.SERVER_NAME, version=request.app.version, extensions=v2.EXTENSIONS)


@router.get("/health/live", response_model=V2Live, summary="Liveness")
async def live() -> V2Live:
    return V2Live(live=True)


@router.get(
    "/health/ready",
    response_model=V2Ready,
    responses={NOT_READY: {"model": V2Ready}},
    summary="Readiness: every model serving, as /ready",
)
async def ready(request: Request) -> JSONResponse:
    is_ready = readiness(state_of(request))[0]
    return JSONResponse(V2Ready(ready=is_ready).model_dump(), status_code=200 if is_ready else NOT_READY)


@router.get("/models/{name}", response_model=V2ModelMetadata, summary="Model metadata", **model_routes)
@router.get("/models/{name}/versions/{version}", response_model=V2ModelMetadata, **model_routes)
async def model_metadata(request: Request, name: str, version: str | None = None) -> V2ModelMetadata:
    return v2.model_metadata(v2.model_at(state_of(request).registry, name, version))


READY_RESPONSES = {**model_routes, "responses": {**V2_RESPONSES, NOT_READY: {"model": V2ModelReady}}}


@router.get("/models/{name}/ready", response_model=V2ModelReady, summary="Model readiness", **READY_RESPONSES)
@router.get("/models/{name}/versions/{version}/ready", response_model=V2ModelReady, **READY_RESPONSES)
async def model_ready(request: Request, name: str, version: str | None = None) -> JSONResponse:
    model = v2.model_at(state_of(request).registry, name, version)
    body = V2ModelReady(name=model.name, ready=model.current is not None)
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else NOT_READY)


INFER = {**model_routes, "response_model": V2InferResponse, "response_model_exclude_none": True}


@router.post("/models/{name}/infer", summary="Inference: the task's inputs and outputs as tensors", **INFER)
@router.post("/models/{name}/versions/{version}/infer", **INFER)
async def infer(
    name: str, body: V2InferRequest, request: Request, response: Response, version: str | None = None
) -> Any:
    state = state_of(request)
    model = state.registry.resolve(None, name)
    assert model.task is not None
    v2.check_shapes(body, state.settings.max_batch_items, max(state.settings.max_choices, 1))
    v2_binary.attach_inputs(body, request.scope.get(v2_binary.SCOPE_KEY))
    decoded = v2.decode(TASKS[model.task], body, state.settings.max_batch_items)
    binary = v2_binary.binary_outputs(body, [t.name for t in decoded.outputs])
    max_queue_ms = state.settings.max_queue_ms
    schedule = schedule_for(request.headers, decoded.timeout_ms, decoded.priority, max_queue_ms)

    async def work(bundle: Bundle, timings: Timings) -> V2InferResponse:
        outputs = await v2.answer_outputs(bundle.service, decoded.rows, decoded.outputs, timings)
        return V2InferResponse(
            model_name=bundle.name, model_version=bundle.version, id=body.id, outputs=outputs
        )

    answer = await run_leased(request, response, model.task, name, work, schedule, version)
    if binary and isinstance(answer, V2InferResponse):
        return v2_binary.binary_response(answer, binary, dict(response.headers))
    return answer
