"""text-embeddings-inference's routes beyond the task routes: /info, /decode, and its default route,
POST / (and SageMaker's /invocations), which a client pointed at the server's root calls
(huggingface_hub's InferenceClient("http://host:8000")); GET / and /ping answer liveness, as TEI's do.

TEI serves one model, whose kind picks what POST / does. Here the body's `model` picks the model, else
the model table's rule (`ModelTable.root`); a body shaped for /rerank (`query`) or /similarity
(`inputs` an object) goes there, as TEI matches reranking by shape. AdmissionMiddleware counts a
request to the root against its default model's task (app/api/middleware.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import msgspec
from fastapi import APIRouter, Query, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Message

from app.api.error_table import INFO_RESPONSES, TASK_RESPONSES, TOKENIZE_RESPONSES
from app.api.lean_route import LeanRoute
from app.api.routes import health, run_leased, state_of
from app.api.routes import router as task_router
from app.api.service_schemas import DecodeRequest, DecodeResponse, HealthResponse, TEIInfo
from app.api.serving.task_service import check_items, cpu_step
from app.errors import InvalidInput
from processing.tasks import TASKS

if TYPE_CHECKING:
    from app.engine.table import Bundle, Model, ModelTable

router = APIRouter(route_class=LeanRoute)
open_router = APIRouter()

DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}  # TEI's names for the precisions
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])


def tei_path(registry: ModelTable, model: Model) -> str:
    """The route TEI's default route is for a model of this kind (another task: its own route)."""
    if model.task not in TASKS:
        registry.serving(None, model.name)  # no task known yet: loading, or failed; says which
    if model.task == "classify":
        return "/rerank" if model.reranker else "/predict"
    return {"embed": "/embed", "sparse": "/embed_sparse"}.get(model.task, TASKS[model.task].path)


def top_level(raw: bytes) -> tuple[dict[str, msgspec.Raw] | None, str | None]:
    """A body's top-level fields, unparsed, and its `model` if that is a string. Not a JSON object:
    None (the route picked words the error); `model` not a string: None (refused by name)."""
    try:
        top = _TOP.decode(raw)
    except msgspec.DecodeError:
        return None, None
    try:
        return top, msgspec.json.decode(top["model"], type=str) if "model" in top else None
    except msgspec.DecodeError:
        return top, None


def root_path(registry: ModelTable, top: dict[str, msgspec.Raw] | None, name: str | None) -> str:
    """The route a body with these fields goes to, for the model `name` (None: the root's default)."""
    top = top or {}
    if "query" in top:
        return "/rerank"
    if bytes(top.get("inputs", b"")).lstrip()[:1] == b"{":
        return "/similarity"
    return tei_path(registry, registry.root(name))


@functools.cache
def _route(path: str) -> tuple[APIRoute, Any]:
    """The task router's POST route at `path`, and its request handler."""
    route = next(
        r for r in task_router.routes if isinstance(r, APIRoute) and r.path == path and "POST" in r.methods
    )
    return route, route.get_route_handler()


# Any body of the routes POST / may pick (the OpenAPI page's "Try it out" sends the first example).
ROOT_BODIES = ("EmbedRequest", "PredictRequest", "RerankRequest", "SimilarityRequest", "EmbedTextsRequest")
ROOT_BODIES += ("NERRequest", "ChoiceRequest", "QARequest")
ROOT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"anyOf": [{"$ref": f"#/components/schemas/{name}"} for name in ROOT_BODIES]},
                "examples": {
                    "embed": {"value": {"inputs": "What is deep learning?"}},
                    "rerank": {
                        "value": {"query": "What is deep learning?", "texts": ["Deep learning is ..."]}
                    },
                },
            }
        },
    }
}


@router.post(
    "/",
    openapi_extra=ROOT_BODY,
    responses=TASK_RESPONSES,
    summary="text-embeddings-inference's default route: /embed, /predict, /rerank, /similarity or "
    "/embed_sparse, by the body's shape and the model it names (else the embedding default)",
)
@router.post(
    "/invocations", openapi_extra=ROOT_BODY, responses=TASK_RESPONSES, summary="SageMaker's name for POST /"
)
async def default_route(request: Request) -> Response:
    top, name = top_level(await request.body())
    return await _answer(request, root_path(state_of(request).registry, top, name))


@router.post(
    "/models/{name}",
    openapi_extra=ROOT_BODY,
    responses=TASK_RESPONSES,
    summary="POST / for the model `name`: a root per model, for clients that take one base URL per "
    'model (InferenceClient("http://host:8000/models/<name>"))',
)
async def model_root(name: str, request: Request) -> Response:
    raw = await request.body()
    top, given = top_level(raw)
    if top is not None and "model" not in top:
        raw = msgspec.json.encode({**top, "model": name})
    elif given is not None and given != name:
        raise InvalidInput(
            f"model is {given!r} but the path names {name!r}: leave it out, or make them agree", "model"
        )
    # Routed by the model the body now names: none when it is not an object or its `model` no string.
    named = name if top is not None and ("model" not in top or given == name) else None
    path = root_path(state_of(request).registry, top, named)
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await request.receive()  # the body is in: what comes next is the disconnect
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    return await _answer(Request(request.scope, receive), path)


async def _answer(request: Request, path: str) -> Response:
    route, handler = _route(path)
    request.scope["route"] = route  # the answer is the target route's: its schema, cache key and errors
    return await handler(request)


@router.get(
    "/info",
    response_model=TEIInfo,
    responses=INFO_RESPONSES,
    summary="text-embeddings-inference's /info: the model POST / serves, or the one named",
)
async def info(
    request: Request, model: str | None = Query(None, description="A name from /models")
) -> TEIInfo:
    return model_info(request, model)


@router.get(
    "/models/{name}/info",
    response_model=TEIInfo,
    responses=INFO_RESPONSES,
    summary="text-embeddings-inference's /info for the model `name` (its own root's)",
)
async def named_info(name: str, request: Request) -> TEIInfo:
    return model_info(request, name)


@router.get(
    "/models/{name}/health",
    response_model=HealthResponse,
    responses=INFO_RESPONSES,
    summary="The model `name` serves (200), or why not: 404 no such model, 503 loading or failed",
)
async def model_health(name: str, request: Request) -> HealthResponse:
    state_of(request).registry.serving(None, name)
    return HealthResponse()


def model_info(request: Request, model: str | None) -> TEIInfo:
    state = state_of(request)
    settings = state.settings
    root = state.registry.root(model)
    bundle = state.registry.serving(None, root.name)
    manifest = bundle.manifest
    batcher = bundle.batcher
    return TEIInfo(
        model_id=bundle.name,
        model_sha=bundle.version,
        model_dtype=DTYPES.get(manifest.variants[bundle.variant].precision, "float32")
        if bundle.variant
        else "float32",
        model_type=model_type(bundle, root.reranker),
        max_concurrent_requests=settings.max_in_flight,
        max_input_length=manifest.max_seq_len,
        max_batch_tokens=batcher.max_batch_tokens if batcher is not None else settings.max_batch_tokens,
        max_batch_requests=settings.max_batch_size,
        max_client_batch_size=settings.max_batch_items,
        auto_truncate=True,  # unset, `truncate` follows CLASSIFY_LONG_TEXT: cut or windowed, never refused
        tokenization_workers=settings.api_servers,
        version=request.app.version,
    )


def model_type(bundle: Bundle, reranker: bool) -> dict[str, dict[str, Any]]:
    manifest = bundle.manifest
    if manifest.task in ("embed", "sparse"):
        pooling = "splade" if manifest.task == "sparse" else (manifest.pooling or {}).get("mode", "mean")
        return {"embedding": {"pooling": pooling}}
    labels = {
        "id2label": dict(enumerate(manifest.labels)),
        "label2id": {n: i for i, n in enumerate(manifest.labels)},
    }
    if manifest.task == "classify":
        return {"reranker" if reranker else "classifier": labels}
    return {manifest.task: labels if manifest.labels else {}}


@router.post(
    "/decode",
    response_model=DecodeResponse,
    responses=TOKENIZE_RESPONSES,
    summary="Token ids back to text, by a model's tokenizer (text-embeddings-inference's /decode)",
)
async def decode(body: DecodeRequest, request: Request, response: Response) -> Any:
    state = state_of(request)
    model = body.model or state.registry.shared_tokenizer_model()
    sequences = body.sequences
    check_items(len(sequences), state.settings.max_batch_items, "ids", "sequences")

    async def work(bundle: Bundle, _: Any) -> list[str]:
        tokenizer = bundle.tokenizer
        assert tokenizer is not None
        for n, ids in enumerate(sequences):
            for k, token in enumerate(ids):
                if token >= tokenizer.vocab_size:
                    field = f"ids.{n}.{k}" if isinstance(body.ids[0], list) else f"ids.{k}"
                    raise InvalidInput(
                        f"{field} is {token}; the vocabulary of {bundle.name} has ids 0 to "
                        f"{tokenizer.vocab_size - 1}",
                        field,
                    )
        return await cpu_step(sum(map(len, sequences)), tokenizer.decode, sequences, body.skip_special_tokens)

    return await run_leased(request, response, None, model, work)


# TEI's liveness at the root (behind the key, as POST / is: the key rule goes by path), and
# SageMaker's probe, never behind it, as /health.
router.get("/", response_model=HealthResponse, summary="Liveness (text-embeddings-inference's GET /)")(health)
open_router.get("/ping", response_model=HealthResponse, summary="Liveness (SageMaker's probe)")(health)
