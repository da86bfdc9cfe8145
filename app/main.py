"""App factory. `MODELS_DIR=<dir> uvicorn app.main:app` serves every bundle under <dir>.

Startup discovers the bundles (a configuration error stops the process); loading, hash
checks and warm-up then run in the background while /health answers and /ready says 503.
On shutdown /ready turns 503 first, in-flight requests finish, then the batchers drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline

from app.api.admin import router as admin_router
from app.api.cache import ResponseCache
from app.api.connections import Guard
from app.api.error_table import install_error_handlers
from app.api.headers import TEI_HEADERS
from app.api.middleware import (
    Admission,
    AdmissionMiddleware,
    AuthMiddleware,
    BodyLimitMiddleware,
    InFlight,
    RequestContextMiddleware,
)
from app.api.remote import FrontTable, RemoteControl, RemoteEngine
from app.api.routes import open_router, router
from app.api.serving.services import make_service
from app.api.tei_routes import open_router as tei_open_router
from app.api.tei_routes import router as tei_router
from app.api.v2_routes import router as v2_router
from app.engine.client import Engine
from app.engine.control import ModelControl
from app.engine.heap import fix_malloc_mmap_threshold
from app.engine.registry import Registry
from app.engine.table import ModelTable
from app.observe.logs import configure_logging, flush_logs
from app.observe.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("app.main")

# Set by app/serve.py for its front-end processes: the engine process's socket.
ENGINE_SOCKET_ENV = "BERT_ENGINE_SOCKET"

DESCRIPTION = """
BERT inference over ONNX Runtime: classification, NER, multiple choice and extractive QA, also
through the KServe V2 / Open Inference Protocol (`/v2`). Requests from all clients are batched
dynamically per model. Errors are JSON objects `{"error", "message", "fields"}` (under `/v2`:
`{"error": message}`); every response carries `X-Request-ID`, and inference
responses a `Server-Timing` header (tokenize, queue, inference, postprocess).
"""


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics
    registry: ModelTable  # the engine's Registry, or a front end's copy of its table (app/api/remote.py)
    in_flight: InFlight
    admission: Admission  # MAX_IN_FLIGHT per task, for HTTP and gRPC alike
    control: ModelControl | RemoteControl | None = None  # loads, swaps and unloads (app/engine/control.py)
    cache: ResponseCache | None = None  # answers of the versions in service (RESPONSE_CACHE_MB); None: off
    shutting_down: bool = False
    loader: asyncio.Task | None = field(default=None, repr=False)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (the one asking excluded by the caller)."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight.count > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return self.in_flight.count <= 0


def _hook_termination(state: ServiceState) -> Callable[[], None]:
    """Turn readiness off the moment SIGTERM/SIGINT arrives, before the server starts draining.

    The server's own handler (uvicorn's) still runs; the returned function restores it.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if not callable(handler):
            continue

        def on_signal(signum: int, frame: Any, _prev: Callable[..., Any] = handler) -> None:
            state.shutting_down = True
            _prev(signum, frame)

        previous[sig] = handler
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, handler)

    return restore


def create_app(settings: Settings | None = None, engine_socket: str | None = None) -> FastAPI:
    """The whole service in this process, or (`engine_socket`: app/serve.py's front ends) its front
    end, with the engine process behind that socket."""
    settings = settings or Settings()
    configure_logging(settings.log_level)
    metrics = Metrics()
    budget = int(settings.response_cache_mb * 2**20)
    cache = ResponseCache(budget, metrics) if budget else None
    on_retired = cache.drop_version if cache is not None else None
    registry: ModelTable
    control: ModelControl | RemoteControl
    if engine_socket is None:
        # The engine's model events reach the front end here: a loaded version gets its service,
        # a retired one's answers leave the cache.
        registry = Registry(settings, metrics)
        engine = Engine()
        control = ModelControl(
            registry,
            engine,
            make_service=lambda bundle: make_service(bundle, settings, engine),
            on_retired=on_retired,
            lone_request=lambda: state.in_flight.count <= 1,  # HTTP and gRPC requests being served
        )
    else:
        registry = FrontTable(settings, lambda bundle: make_service(bundle, settings, remote), on_retired)
        remote = RemoteEngine(engine_socket, registry)
        control = RemoteControl(remote, registry)
    state = ServiceState(
        settings=settings,
        metrics=metrics,
        registry=registry,
        in_flight=InFlight(metrics),
        admission=Admission(settings.max_in_flight, metrics),
        control=control,
        cache=cache,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if isinstance(control, RemoteControl):
            await control.engine.start()  # the engine's table arrives, and keeps arriving
        else:
            registry.discover()  # ConfigError here stops the server: nothing sensible to serve
            if fix_malloc_mmap_threshold(settings.malloc_mmap_threshold):  # before any session exists
                log.debug("malloc mmap threshold fixed", extra={"bytes": settings.malloc_mmap_threshold})
            # Loads every model, then watches MODELS_DIR when MODEL_POLL_S is set.
            state.loader = asyncio.create_task(control.run(), name="load-bundles")
        grpc_server = None
        if settings.grpc_port is not None:  # grpc is imported only where it serves
            from app.api.grpc_v2 import server as grpc_v2

            grpc_server = await grpc_v2.start(state, app.version, settings.grpc_host, settings.grpc_port)
            log.info("serving gRPC", extra={"host": settings.grpc_host, "port": settings.grpc_port})
        restore_signals = _hook_termination(state)
        try:
            yield
        finally:
            state.shutting_down = True
            log.info("shutting down: readiness is off, waiting for in-flight requests")
            # gRPC takes no new calls from here; its calls in flight count in state.in_flight.
            stopping = (
                asyncio.ensure_future(grpc_server.stop(settings.shutdown_grace_s)) if grpc_server else None
            )
            if not await state.wait_idle(settings.shutdown_grace_s):
                log.warning(
                    "shutdown grace period over with requests still in flight",
                    extra={"in_flight": state.in_flight.count},
                )
            if state.loader is not None and not state.loader.done():
                state.loader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await state.loader
            if stopping is not None:
                await stopping
            await control.close()
            gc.unfreeze()  # settle_heap's objects: collectable again once the app is gone
            restore_signals()
            log.info("shutdown complete")
            flush_logs()

    # /docs and /redoc load Swagger UI and ReDoc from files installed with fastapi-offline, not
    # from a CDN: the docs work where the browser has no internet. No online validator badge either.
    app = FastAPIOffline(
        title="BERT inference service",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.state.service_state = state
    install_error_handlers(app)
    app.include_router(router)  # behind the key when one is set: AuthMiddleware
    app.include_router(open_router)
    app.include_router(tei_router)
    app.include_router(tei_open_router)
    app.include_router(v2_router)
    app.include_router(admin_router)
    # Added innermost first: the request-context middleware wraps everything, CORS headers
    # reach error responses too, oversized bodies stop before FastAPI parses them, and excess
    # requests are refused once their body is in (so slow senders never hold an admission slot)
    # but before it is parsed and tokenized.
    app.add_middleware(AdmissionMiddleware, admission=state.admission)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        metrics=metrics,
        max_items=settings.max_batch_items,
        max_choices=settings.max_choices,
        refusal_delay_s=settings.refusal_delay_ms / 1000,
    )
    # The key before any body byte is read: a refused client costs a header lookup.
    app.add_middleware(AuthMiddleware, api_key=settings.api_key, admin_api_key=settings.admin_api_key)
    origins = settings.cors_origin_list
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=[
                *("X-Request-ID", "Server-Timing", "Retry-After", "X-Model", "X-Model-Version"),
                *("X-Cache", "X-Truncated-Inputs", "X-Windowed-Inputs"),
                *TEI_HEADERS,
            ],
        )
    app.add_middleware(RequestContextMiddleware, metrics=metrics, in_flight=state.in_flight)
    Guard.counter = metrics.connections_refused  # the connection layer's refusals, under uvicorn
    return app


app = create_app(engine_socket=os.environ.get(ENGINE_SOCKET_ENV))
