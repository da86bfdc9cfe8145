"""The Open Inference Protocol over gRPC on GRPC_PORT: KServe V2's `inference.GRPCInferenceService`
(ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer), as Triton and KServe
serve it, beside HTTP in the same process and event loop (each front end's, under API_SERVERS > 1).

Every rule is the V2 HTTP routes', from the same code: tensors <-> tasks (app/api/v2.py), the key
rule (app/api/auth.py, by the RPC's HTTP twin: health and readiness open, metadata and inference
behind API_KEY, sent as `authorization: Bearer <key>` metadata), MAX_IN_FLIGHT (the shared
Admission), the error table (an error's HTTP status and, in GRPC_CODES, its gRPC code; its code name
is the `error-code` trailer), request ids (`x-request-id`), the schedule (the `timeout_ms` /
`priority` parameters or `x-timeout-ms` / `x-priority` metadata, cut to the call's gRPC deadline),
metrics and access logs. MAX_BODY_BYTES bounds a message and MAX_HEADER_BYTES its metadata. Tensor
data come as typed `contents` or as `raw_input_contents` (Triton's client sends raw); the answer is
raw when the request was, which is how Triton's client reads it. Not here: the response cache, and
Triton's extra RPCs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from pydantic import ValidationError
from starlette.datastructures import Headers

from app.api import v2, v2_binary
from app.api.auth import KeyRule
from app.api.connections import connection_budget
from app.api.error_table import (
    CLIENT_CLOSED,
    GRPC_CODES,
    RETRY_AFTER_S,
    client_message,
    status_for,
    status_of,
)
from app.api.grpc_v2.messages import (
    CLASSES,
    HEALTH_METHODS,
    HEALTH_SERVICE,
    METHODS,
    NOT_SERVING,
    SERVICE,
    SERVING,
)
from app.api.routes import readiness
from app.api.scheduling import schedule_for
from app.api.serving.task_service import Timings
from app.api.v2_schemas import V2InferRequest, V2OutputTensor
from app.errors import InternalError, InvalidTensor, ServiceError, Unauthorized
from app.observe.logs import new_request_id, request_id_var
from processing.tasks import TASKS

log = logging.getLogger("app.access")

# The V2 HTTP route each RPC is: the key rule goes by path (app/api/auth.py).
HTTP_TWIN = {
    "ServerLive": "/v2/health/live",
    "ServerReady": "/v2/health/ready",
    "ServerMetadata": "/v2",
    "ModelReady": "/v2/models/_/ready",
    "ModelMetadata": "/v2/models/_",
    "ModelInfer": "/v2/models/_/infer",
    "Check": "/ready",  # gRPC's health check
}
IDLE_MS = 75_000
QUIET = {"ServerLive", "ServerReady", "ModelReady", "Check"}  # probes: logged at DEBUG, as /health is
# Typed contents by datatype (INT8/16 and UINT8/16 travel widened, as the protocol says).
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def code_of(status: int) -> grpc.StatusCode:
    """An error's HTTP status as its gRPC code: one table (app/api/error_table.py)."""
    return grpc.StatusCode[GRPC_CODES[status]]


def parameters_of(parameters: Any, where: str) -> dict[str, Any] | None:
    """A protobuf map<string, InferParameter> as the JSON form's dict (None when empty)."""
    out = {}
    for key, value in parameters.items():
        kind = value.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidTensor(f"{where}: parameter {key!r} has no value")
        out[key] = getattr(value, kind)
    return out or None


def tensor_data(tensor: Any, raw: bytes | None) -> list[Any]:
    """One input's elements, flat: from its raw bytes (Triton's layout) or its typed contents."""
    where = f"input {tensor.name!r}"
    if raw is not None:
        return v2_binary.from_bytes(where, tensor.datatype, list(tensor.shape), raw)
    field = CONTENTS.get(tensor.datatype)
    values = list(getattr(tensor.contents, field)) if field else []
    if tensor.datatype != "BYTES":
        return values
    try:
        return [value.decode("utf-8") for value in values]
    except UnicodeDecodeError:
        raise InvalidTensor(f"{where}: an element of its bytes_contents is not UTF-8 text") from None


def to_request(message: Any, max_rows: int, max_row_elements: int) -> V2InferRequest:
    """A ModelInferRequest as the JSON form's request, checked as the HTTP route checks it: shapes
    first, from the shapes alone, then the data."""
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise InvalidTensor(
            f"raw_input_contents holds {len(raw)} tensors for {len(message.inputs)} inputs: give every "
            "input's data raw, in input order, or none"
        )
    body = {
        "id": message.id or None,
        "parameters": parameters_of(message.parameters, "the request"),
        "inputs": [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": list(t.shape),
                "parameters": parameters_of(t.parameters, f"input {t.name!r}"),
            }
            for t in message.inputs
        ],
        "outputs": [
            {"name": o.name, "parameters": parameters_of(o.parameters, f"output {o.name!r}")}
            for o in message.outputs
        ]
        or None,
    }
    try:
        request = V2InferRequest.model_validate(body)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in e.errors(include_url=False)
        )
        raise InvalidTensor(problems) from None
    v2.check_shapes(request, max_rows, max_row_elements)
    for index, (tensor, given) in enumerate(zip(request.inputs, message.inputs, strict=True)):
        tensor.data = tensor_data(given, raw[index] if raw else None)
    return request


def to_reply(outputs: list[V2OutputTensor], raw: bool, **fields: Any) -> Any:
    reply = CLASSES["ModelInferResponse"](**fields)
    for tensor in outputs:
        out = reply.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        data = tensor.data or []
        if raw:
            reply.raw_output_contents.append(v2_binary.to_bytes(tensor.datatype, data))
        elif tensor.datatype == "BYTES":
            out.contents.bytes_contents.extend(str(x).encode("utf-8") for x in data)
        else:
            getattr(out.contents, CONTENTS[tensor.datatype]).extend(data)
    return reply


class InferenceService:
    """The RPCs, each run by `call` (key, errors, request id, metrics, logs) on the app's state."""

    def __init__(self, state: Any, version: str):
        self.state, self.version = state, version
        self.keys = KeyRule(state.settings.api_key, state.settings.admin_api_key)

    def handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        def handler(service: str, rpc: str, request: str) -> grpc.RpcMethodHandler:
            # Bytes in: a malformed message is the client's error (INVALID_ARGUMENT, named), not
            # grpc's INTERNAL.
            return grpc.unary_unary_rpc_method_handler(
                self.call(service, rpc, request, getattr(self, rpc)),
                response_serializer=lambda reply: reply.SerializeToString(),
            )

        return tuple(
            grpc.method_handlers_generic_handler(
                service, {rpc: handler(service, rpc, request) for rpc, (request, _) in methods.items()}
            )
            for service, methods in ((SERVICE, METHODS), (HEALTH_SERVICE, HEALTH_METHODS))
        )

    def call(
        self,
        service: str,
        rpc: str,
        request: str,
        serve: Callable[[Any, Headers, Any], Awaitable[tuple[Any, str]]],
    ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]:
        state, endpoint, parse = self.state, f"/{service}/{rpc}", CLASSES[request].FromString

        async def run(data: bytes, context: grpc.aio.ServicerContext) -> Any:
            metadata = Headers(
                raw=[
                    (k.encode("latin-1", "replace"), v.encode("latin-1", "replace"))
                    for k, v in context.invocation_metadata() or ()
                    if isinstance(v, str)
                ]
            )
            request_id = new_request_id(metadata.get("x-request-id"))
            token = request_id_var.set(request_id)
            trailers: tuple[tuple[str, str], ...] = (("x-request-id", request_id),)
            status, model, started = 200, "", time.perf_counter()
            state.in_flight.enter()
            try:
                refused = self.keys.refusal(HTTP_TWIN[rpc], metadata.get("authorization", ""))
                if refused is not None:
                    raise Unauthorized(refused)
                try:
                    message = parse(data)
                except DecodeError:
                    raise InvalidTensor(f"the request is not a valid {request} message") from None
                reply, model = await serve(message, metadata, context)
                context.set_trailing_metadata(trailers)
                return reply
            except ServiceError as e:
                kind = status_of(e)
                status = kind.status
                trailers += (("error-code", kind.code),)
                if kind.retry:
                    trailers += (("retry-after", str(RETRY_AFTER_S)),)
                await context.abort(code_of(status), client_message(e), trailers)
            except asyncio.CancelledError:
                status = CLIENT_CLOSED
                raise
            except Exception:
                log.exception("unhandled error", extra={"path": endpoint})
                status = status_for(InternalError).status
                message = f"internal server error (request id {request_id})"
                await context.abort(code_of(status), message, (*trailers, ("error-code", "internal_error")))
            finally:
                elapsed = time.perf_counter() - started
                state.in_flight.leave()
                metrics = state.metrics
                metrics.child(metrics.requests, endpoint, str(status), model).inc()
                metrics.child(metrics.latency, endpoint, model).observe(elapsed)
                extra = {"method": "gRPC", "path": endpoint, "status": status}
                extra |= {"duration_ms": round(elapsed * 1000, 2), **({"model": model} if model else {})}
                log.log(logging.DEBUG if rpc in QUIET else logging.INFO, "request", extra=extra)
                request_id_var.reset(token)

        return run

    # The RPCs: (reply, the model that answered or "").

    async def ServerLive(self, message: Any, metadata: Headers, context: Any) -> tuple[Any, str]:
        return CLASSES["ServerLiveResponse"](live=True), ""

    async def Check(self, message: Any, metadata: Headers, context: Any) -> tuple[Any, str]:
        """gRPC's health check: the server's readiness ("" or the V2 service), or a model's."""
        if message.service in ("", SERVICE):
            ready = readiness(self.state)[0]
        else:  # an unknown name: NOT_FOUND, as the health protocol asks
            model = self.state.registry.resolve(None, message.service)
            ready = model.current is not None and not self.state.shutting_down
        return CLASSES["HealthCheckResponse"](status=SERVING if ready else NOT_SERVING), ""

    async def ServerReady(self, message: Any, metadata: Headers, context: Any) -> tuple[Any, str]:
        return CLASSES["ServerReadyResponse"](ready=readiness(self.state)[0]), ""

    async def ModelReady(self, message: Any, metadata: Headers, context: Any) -> tuple[Any, str]:
        model = v2.model_at(self.state.registry, message.name, message.version or None)
        return CLASSES["ModelReadyResponse"](ready=model.current is not None), ""

    async def ServerMetadata(self, message: Any, metadata: Headers, context: Any) -> tuple[Any, str]:
        reply = CLASSES["ServerMetadataResponse"]
        return reply(name=v2.SERVER_NAME, version=self.version, extensions=v2.GRPC_EXTENSIONS), ""

    async def ModelMetadata(self, message: Any, metadata: Headers, context: Any) -> tuple[Any, str]:
        meta = v2.model_metadata(v2.model_at(self.state.registry, message.name, message.version or None))
        return CLASSES["ModelMetadataResponse"](**meta.model_dump()), ""

    async def ModelInfer(self, message: Any, metadata: Headers, context: Any) -> tuple[Any, str]:
        state, settings = self.state, self.state.settings
        model = state.registry.resolve(None, message.model_name)
        assert model.task is not None
        refused = state.admission.refusal(model.task)  # before any tensor is decoded or text tokenized
        if refused is not None:
            raise refused
        try:
            spec = TASKS[model.task]
            if len(message.inputs) > len(spec.v2.inputs) or len(message.outputs) > len(spec.v2.outputs):
                raise InvalidTensor(  # before any of them is read
                    f"{len(message.inputs)} inputs and {len(message.outputs)} requested outputs: {spec.name} "
                    f"models take {v2.describe(spec.v2.inputs)} and answer {v2.describe(spec.v2.outputs)}"
                )
            body = to_request(message, settings.max_batch_items, max(settings.max_choices, 1))
            decoded = v2.decode(spec, body, settings.max_batch_items)
            timeout_ms = decoded.timeout_ms
            left = context.time_remaining()  # None: the call has no deadline
            if left is not None:
                timeout_ms = min(timeout_ms or float("inf"), max(left * 1000, 0.001))
            schedule = schedule_for(metadata, timeout_ms, decoded.priority, settings.max_queue_ms)
            with state.registry.lease(model.task, model.name, message.model_version or None) as bundle:
                timings = Timings(schedule)
                outputs = await v2.answer_outputs(bundle.service, decoded.rows, decoded.outputs, timings)
            timings.observe(state.metrics, bundle.task, bundle.name)
        finally:
            state.admission.leave(model.task)
        raw = len(message.raw_input_contents) > 0
        reply = to_reply(outputs, raw, model_name=bundle.name, model_version=bundle.version, id=message.id)
        return reply, bundle.name


async def start(state: Any, version: str, host: str, port: int) -> grpc.aio.Server:
    """Serve the RPCs on host:port."""
    settings = state.settings
    options = [
        ("grpc.max_receive_message_length", settings.max_body_bytes),
        ("grpc.max_metadata_size", settings.max_header_bytes),
        # Its share of MAX_CONNECTIONS (connections.connection_budget); beyond it new connections close.
        ("grpc.max_allowed_incoming_connections", connection_budget(settings.max_connections, port)[1]),
        # An idle connection (no call) closes after this long, as HTTP's keep-alive in the image does,
        # so idle sockets cannot hold the share; clients reconnect on their next call.
        ("grpc.max_connection_idle_ms", IDLE_MS),
        # A connection must finish its handshake as quickly as a request's headers must arrive.
        ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * 1000)),
        # Every process of one service listens on the port (API_SERVERS front ends, uvicorn's --workers)
        # and the kernel spreads connections over them; a port held by anything else fails here.
        ("grpc.so_reuseport", 1),
    ]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers(InferenceService(state, version).handlers())
    try:
        server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:
        raise RuntimeError(f"GRPC_PORT: cannot listen on {host}:{port} ({e})") from None  # start-up stops
    await server.start()
    return server
