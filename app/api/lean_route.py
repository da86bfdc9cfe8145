"""A FastAPI route class whose handler skips FastAPI's generic request handling for the common case.

FastAPI's per-request handler is written for every kind of endpoint (forms, streams, arbitrary
dependency graphs, telemetry spans); on a short /embed request it cost ~60 us of the event loop's
~500 (docs/performance.md, section 2). A task route has one shape: a JSON body that is one pydantic
model, `Request` and `Response`, at most request-only checks (the API key), and a response model.
For a request in the plain case (`application/json`, a body that validates in pydantic's JSON mode)
`LeanRoute` validates and calls the endpoint directly and serializes with FastAPI's own
`serialize_response`. Everything else (another content type, an empty or invalid body, telemetry
configured) goes to FastAPI's handler, so errors, their bodies and their order are FastAPI's.
tests/app/test_lean_route.py checks both paths answer alike.

Only FastAPI's public names are imported (no private module or underscored name), so a FastAPI
release can change its internals without breaking the import; the lock pins the release the tests
passed on. The dependencies it runs are the route's own and its router's (`APIRouter(dependencies=)`,
merged into the route when it is added): a router of LeanRoutes must not be included with
`include_router(dependencies=...)`, whose dependencies only FastAPI's private context carries. The
API key is checked before routing anyway (app/api/middleware.py, AuthMiddleware).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.routing import APIRoute, serialize_response
from fastapi.utils import is_body_allowed_for_status_code
from pydantic import BaseModel, ValidationError

try:  # OpenTelemetry spans: FastAPI >= 0.160 (a public package); none before
    from fastapi.telemetry import get_telemetry_data
except ImportError:  # pragma: no cover

    def get_telemetry_data() -> None:
        return None


Handler = Callable[[Request], Coroutine[Any, Any, Response]]
# Bodies larger than this are validated in a worker thread, not on the event loop: pydantic reads
# JSON at tens of MB/s, so 32 kB is about a millisecond (a 900 kB /classify of 56k inputs held the
# loop for hundreds of ms before its 422).
OFF_LOOP_BYTES = 32 << 10


def is_plain_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.partition(";")[0].strip().lower() == "application/json"


class LeanRoute(APIRoute):
    def get_route_handler(self) -> Handler:
        full = super().get_route_handler()
        lean = _lean_handler(self, full)
        return lean if lean is not None else full


def _has_parameters(dependant: Any) -> bool:
    """Path, query, header or cookie parameters: FastAPI's handler reads them from the request."""
    d = dependant
    return bool(d.path_params or d.query_params or d.header_params or d.cookie_params)


def _lean_handler(route: Any, full: Handler) -> Handler | None:
    """The lean handler of `route`, or None when the route is not of the one shape it handles."""
    dependant = route.dependant
    if (
        _has_parameters(dependant)
        or len(dependant.body_params) != 1
        or dependant.background_tasks_param_name
        or getattr(dependant.body_params[0].field_info, "embed", False)
        or route.response_field is None
        or not isinstance(route.response_class, DefaultPlaceholder)
        or not inspect.iscoroutinefunction(dependant.call)
    ):
        return None
    model = dependant.body_params[0].field_info.annotation
    if not (inspect.isclass(model) and issubclass(model, BaseModel)):
        return None
    checks = []  # request-only dependencies, e.g. the API key
    for sub in dependant.dependencies:
        if (
            sub.dependencies
            or _has_parameters(sub)
            or sub.body_params
            or sub.response_param_name
            or not sub.request_param_name
            or not inspect.iscoroutinefunction(sub.call)
        ):
            return None
        checks.append((sub.call, sub.request_param_name))
    body_name, call, field = dependant.body_params[0].name, dependant.call, route.response_field
    request_name, response_name, status_code = (
        dependant.request_param_name,
        dependant.response_param_name,
        route.status_code,
    )
    options = {
        "include": route.response_model_include,
        "exclude": route.response_model_exclude,
        "by_alias": route.response_model_by_alias,
        "exclude_unset": route.response_model_exclude_unset,
        "exclude_defaults": route.response_model_exclude_defaults,
        "exclude_none": route.response_model_exclude_none,
    }

    async def handler(request: Request) -> Response:
        raw = await request.body()  # read once: FastAPI's handler reuses it on the fallback
        if not raw or not is_plain_json(request.headers.get("content-type")) or get_telemetry_data():
            return await full(request)
        try:
            if len(raw) > OFF_LOOP_BYTES:  # a parse of more than about a millisecond: in a thread
                body = await asyncio.to_thread(model.model_validate_json, raw)
            else:
                body = model.model_validate_json(raw)
        except ValidationError:
            return await full(request)  # FastAPI words the 422 (and any earlier 401)
        for check, name in checks:
            await check(**{name: request})
        # The endpoint's `response` parameter, as FastAPI makes it: headers and status to merge.
        sub = Response()
        del sub.headers["content-length"]
        sub.status_code = None  # type: ignore[assignment]
        values: dict[str, Any] = {body_name: body}
        if request_name:
            values[request_name] = request
        if response_name:
            values[response_name] = sub
        result = await call(**values)
        if isinstance(result, Response):
            return result
        content = await serialize_response(field=field, response_content=result, dump_json=True, **options)
        status = sub.status_code or status_code or 200
        response = Response(content, media_type="application/json", status_code=status)
        if not is_body_allowed_for_status_code(response.status_code):
            response.body = b""
        response.headers.raw.extend(sub.headers.raw)
        return response

    return handler
