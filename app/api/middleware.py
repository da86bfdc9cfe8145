"""Pure ASGI middleware: request ids, access logs and request metrics; the request body limit."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from pydantic import SecretStr
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.auth import ADMIN_PREFIX, KeyRule, bearer_ok
from app.api.error_table import (
    CLIENT_CLOSED,
    ERRORS,
    RETRY_AFTER_S,
    domain_error_response,
    is_v2_path,
    v2_errors,
)
from app.api.precount import GZIP_MAGIC, PRECOUNT_BYTES, precount, v2_header_length
from app.errors import (
    BodyTooLarge,
    InternalError,
    Overloaded,
    RequestError,
    ServiceError,
    Unauthorized,
    UnsupportedMediaType,
)
from app.observe.logs import new_request_id, request_id_var
from app.observe.metrics import Metrics
from processing.tasks import TASK_PATHS

log = logging.getLogger("app.access")

ROOT_PATHS = ("/", "/invocations")  # TEI's default route, SageMaker's name for it
KNOWN_PATHS = set(TASK_PATHS) | {
    "/health",
    "/ready",
    "/metrics",
    "/models",
    "/v1/models",
    "/tokenize",
    *ROOT_PATHS,
    *("/info", "/decode", "/ping"),  # text-embeddings-inference's (tei_routes.py)
    "/docs",
    "/openapi.json",
    "/redoc",
    "/v2",
    "/v2/health/live",
    "/v2/health/ready",
}
QUIET_PATHS = {"/health", "/ready", "/metrics", "/ping", "/v2/health/live", "/v2/health/ready"}
MODEL_SCOPE_KEY = "bert.model"  # set by the route to the model that served the request
# /v2/models/{name}[/versions/{version}][/ready | /infer]: labelled by the route, never the raw name.
# /models/{name}[/info | /health]: a model's own TEI root (app/api/tei_routes.py), labelled likewise.
MODEL_ROOT_PATH = re.compile(r"^/models/(?P<name>[^/]+)(?P<verb>/info|/health)?$")
V2_MODEL_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/[^/]+)?(?P<verb>/ready|/infer)?$")


LOGGED_CHARS = 256  # of a client-chosen field in a log line: a 64 kB path must not become a 64 kB line


def capped(text: str) -> str:
    extra = len(text) - LOGGED_CHARS
    return text if extra <= 0 else f"{text[:LOGGED_CHARS]}...(+{extra} chars)"


def endpoint_label(path: str) -> str:
    # Raw paths would let any client create unbounded metric label values.
    if path.startswith(ADMIN_PREFIX):
        return "/admin"
    v2 = V2_MODEL_PATH.match(path)
    if v2:
        return "/v2/models/{name}" + (v2["verb"] or "")
    root = MODEL_ROOT_PATH.match(path)
    if root:
        return "/models/{name}" + (root["verb"] or "")
    return path if path in KNOWN_PATHS else "other"


def inference_task(scope: Scope) -> str | None:
    """The task a POST is inference for (its in-flight limit): a task route's, or a V2 infer's
    model's (looked up by name; an unknown name goes through, to be answered 404 by the route)."""
    path = scope["path"]
    if path in TASK_PATHS:
        return TASK_PATHS[path]
    root = MODEL_ROOT_PATH.match(path)
    if (path in ROOT_PATHS or (root and not root["verb"])) and "app" in scope:
        # TEI's root (its default model's task, before the body is read) or a model's own root.
        try:
            return scope["app"].state.service_state.registry.root(root["name"] if root else None).task
        except ServiceError:  # no such model, or no default: the route answers 404
            return None
    v2 = V2_MODEL_PATH.match(path)
    if v2 and v2["verb"] == "/infer" and "app" in scope:
        model = scope["app"].state.service_state.registry.models.get(v2["name"])
        return model.task if model is not None else None
    return None


class InFlight:
    """Requests being served; shutdown waits for this to reach zero."""

    def __init__(self, metrics: Metrics):
        self.count = 0
        self._gauge = metrics.in_flight

    def enter(self) -> None:
        self.count += 1
        self._gauge.inc()

    def leave(self) -> None:
        self.count -= 1
        self._gauge.dec()


class Admission:
    """MAX_IN_FLIGHT requests per task being served: the one back-pressure point of every protocol
    (AdmissionMiddleware for HTTP, app/api/grpc_v2/server.py for gRPC)."""

    def __init__(self, max_in_flight: int, metrics: Metrics):
        self.max_in_flight, self.metrics = max_in_flight, metrics
        self.active = dict.fromkeys(TASK_PATHS.values(), 0)

    def refusal(self, task: str) -> Overloaded | None:
        """None when a request of `task` may start now (the caller then holds a slot until `leave`)."""
        if self.active[task] < self.max_in_flight:
            self.active[task] += 1
            return None
        self.metrics.rejected.labels(task=task, reason="in_flight_limit", model="").inc()
        return Overloaded(
            f"server is busy: {self.active[task]} {task} requests in flight (MAX_IN_FLIGHT); "
            f"retry after {RETRY_AFTER_S}s"
        )

    def leave(self, task: str) -> None:
        self.active[task] -= 1


class AdmissionMiddleware:
    """Refuse an inference request with 429 when its task already has MAX_IN_FLIGHT requests
    being served. It sits inside BodyLimitMiddleware: a request counts once its body is in, so
    clients that send slowly never hold a slot.

    The batcher's queue bound alone is not enough under overload: a refused request would first be
    parsed, validated and tokenized, which costs nearly as much CPU as serving it, so refusals would
    wait behind the backlog, and every waiting request would hold its parsed body in memory.
    """

    def __init__(self, app: ASGIApp, admission: Admission):
        self.app, self.admission = app, admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = inference_task(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        if task is None or task not in self.admission.active:
            await self.app(scope, receive, send)
            return
        refused = self.admission.refusal(task)
        if refused is not None:
            await domain_error_response(refused, refused.message)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.leave(task)


def bearer_matches(scope: Scope, key: SecretStr) -> bool:
    return bearer_ok(Headers(scope=scope).get("authorization", ""), key)


def has_body(scope: Scope) -> bool:
    headers = Headers(scope=scope)
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers


class AuthMiddleware:
    """The key is checked from the headers alone, before any byte of the body is read or parsed:
    401 whatever the body, on every route but the open ones (app/api/auth.py). Under uvicorn the
    connection layer has refused most such requests already; a refused request's body is never
    read: its connection closes after the answer."""

    def __init__(self, app: ASGIApp, api_key: SecretStr | None, admin_api_key: SecretStr | None):
        self.app, self.rule = app, KeyRule(api_key, admin_api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.rule.keyless or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = self.rule.refusal(scope["path"], Headers(scope=scope).get("authorization", ""))
        if message is None:
            await self.app(scope, receive, send)
            return
        response = domain_error_response(Unauthorized(message), message)
        if has_body(scope):
            response.headers["connection"] = "close"
        await response(scope, receive, send)


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics, in_flight: InFlight):
        self.app, self.metrics, self.in_flight = app, metrics, in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id(Headers(scope=scope).get("x-request-id"))
        token = request_id_var.set(request_id)
        family = v2_errors.set(is_v2_path(scope["path"]))  # which error body the request gets
        endpoint = endpoint_label(scope["path"])
        state: dict[str, Any] = {"status": ERRORS[InternalError].status, "started": False}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"], state["started"] = message["status"], True
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        started = time.perf_counter()
        self.in_flight.enter()
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # Last line of defence: log the traceback, answer a bare 500 without it.
            log.exception("unhandled error", extra={"path": capped(scope["path"])})
            message = f"internal server error (request id {request_id})"
            response = domain_error_response(InternalError(message), message)
            state["status"] = response.status_code
            if not state["started"]:
                await response(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            self.in_flight.leave()
            if not state["started"]:  # the connection layer answered (408, 503), or the client left
                state["status"] = scope.get("bert.refused", CLIENT_CLOSED)
            status = str(state["status"])
            model = scope.get(MODEL_SCOPE_KEY, "")
            self.metrics.child(self.metrics.requests, endpoint, status, model).inc()
            self.metrics.child(self.metrics.latency, endpoint, model).observe(elapsed)
            log.log(
                logging.DEBUG if scope["path"] in QUIET_PATHS else logging.INFO,
                "request",
                extra={
                    "method": capped(scope.get("method") or ""),
                    "path": capped(scope["path"]),
                    "status": state["status"],
                    "duration_ms": round(elapsed * 1000, 2),
                    **({"model": model} if model else {}),
                },
            )
            request_id_var.reset(token)
            v2_errors.reset(family)


class BodyLimitMiddleware:
    """Read the whole body up to `max_bytes` before the app sees it: 413 beyond, without buffering
    more. A large JSON body's lists are then counted before anything parses it (app/api/precount.py),
    in a worker thread; one over the limits is let go and refused after `refusal_delay_s`, as the
    connection layer's refusals are (REFUSAL_DELAY_MS)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        metrics: Metrics,
        max_items: int,
        max_choices: int,
        refusal_delay_s: float = 0.0,
    ):
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics
        self.max_items, self.max_choices, self.refusal_delay_s = max_items, max_choices, refusal_delay_s

    async def _count(self, path: str, body: bytes, head: bool) -> RequestError | None:
        """What refuses `body` (a V2 binary request's JSON `head`, or a whole JSON body) by its
        counts. A small JSON body is left to pydantic, which refuses it as cheaply."""
        if len(body) > PRECOUNT_BYTES:
            return await asyncio.to_thread(precount, path, body, self.max_items, self.max_choices)
        return precount(path, body, self.max_items, self.max_choices) if head else None

    async def _refuse_counts(
        self, scope: Scope, receive: Receive, send: Send, error: RequestError, unread: bool
    ) -> None:
        """With `unread`, the rest of the body is never read and the connection closes after it."""
        await asyncio.sleep(self.refusal_delay_s)
        response = domain_error_response(error, str(error), error.field)
        if unread:
            response.headers["connection"] = "close"
        await response(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        task = TASK_PATHS.get(scope["path"], "none")
        self.metrics.rejected.labels(task=task, reason="payload_too_large", model="").inc()
        message = f"request body is {size} bytes; the limit is {self.max_bytes} (MAX_BODY_BYTES)"
        response = domain_error_response(BodyTooLarge(message, "body"), message, "body")
        await response(scope, receive, send)

    async def _unsupported(self, scope: Scope, receive: Receive, send: Send, what: str) -> None:
        message = f"{what}: send the body uncompressed (UTF-8 JSON, or V2's binary form)"
        response = domain_error_response(UnsupportedMediaType(message), message, "body")
        response.headers["connection"] = "close"  # what is left of the body is never read
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send, declared)
            return
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            what = f"Content-Encoding {encoding[:40]!r} is not supported"
            await self._unsupported(scope, receive, send, what)
            return
        # V2's binary form: its JSON header comes first; its shapes are checked once it is in, and a
        # refused request's binary data is never read.
        length = v2_header_length(scope["path"], headers.get("inference-header-content-length", ""))
        binary, v2_head = length is not None, length or 0
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # client gone before it finished sending
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                await self._reject(scope, receive, send, f"more than {self.max_bytes}")
                return
            chunks.append(body)
            more = message.get("more_body", False)
            if v2_head and total >= v2_head:
                head, v2_head = b"".join(chunks)[:v2_head], 0
                error = await self._count(scope["path"], head, True)  # None if not JSON (gzip: 415 below)
                if error is not None:
                    chunks.clear()  # not held through the delay
                    await self._refuse_counts(scope, receive, send, error, unread=more)
                    return
            if not more:
                break
        if chunks and chunks[0][:2] == GZIP_MAGIC:  # JSON, and V2's JSON header, never start so
            await self._unsupported(scope, receive, send, "the body is gzip-compressed")
            return
        body = b"".join(chunks)
        error = None if binary else await self._count(scope["path"], body, False)
        if error is not None:
            chunks, body = [], b""  # not held through the delay
            await self._refuse_counts(scope, receive, send, error, unread=False)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)
