"""LeanRoute (app/api/lean_route.py) answers exactly as FastAPI's own handler, and takes its short
path only where it should: twin apps, one per route class, get the same requests."""

from __future__ import annotations

import fastapi.routing
import httpx
import pytest
from fastapi import APIRouter, BackgroundTasks, Depends, FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.api.lean_route import LeanRoute, is_plain_json
from tests.app.conftest import serving


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1)
    n: int = 1
    mode: str = "ok"

    @model_validator(mode="after")
    def _not_both(self) -> Body:
        if self.text == "forbidden" and self.n > 1:
            raise ValueError("'forbidden' goes alone")
        return self


class Out(BaseModel):
    text: str
    n: int
    note: str | None = None


async def key(request: Request) -> None:
    if request.headers.get("authorization") == "Bearer wrong":
        raise HTTPException(401, "bad key")


def twin(route_class: type[fastapi.routing.APIRoute]) -> FastAPI:
    # Router-level dependencies are merged into each route (public FastAPI); LeanRoute runs them.
    router = APIRouter(route_class=route_class, dependencies=[Depends(key)])

    @router.post("/echo", response_model=Out, response_model_exclude_none=True)
    async def echo(body: Body, request: Request, response: Response) -> object:
        if body.mode == "raise":
            raise HTTPException(409, "conflict")
        if body.mode == "response":
            return Response(b"raw", media_type="text/plain", headers={"x-own": "1"})
        if body.mode == "status":
            response.status_code = 202
        response.headers["x-seen"] = request.url.path
        return {"text": body.text, "n": body.n, "note": None}

    app = FastAPI()
    app.include_router(router)
    return app


REQUESTS = [  # (content-type, body, authorization)
    ("application/json", b'{"text": "hello", "n": 2}', None),
    ("application/json; charset=utf-8", b'{"text": "hello"}', None),
    ("Application/JSON", b'{"text": "hello"}', None),
    ("application/json", b'{"text": "hello", "mode": "status"}', None),
    ("application/json", b'{"text": "hello", "mode": "response"}', None),
    ("application/json", b'{"text": "hello", "mode": "raise"}', None),
    ("application/json", b'{"text": "hello"}', "Bearer wrong"),
    ("application/json", b'{"text": ""}', None),  # invalid: FastAPI's 422
    ("application/json", b'{"text": "hello", "txt": 1}', None),
    ("application/json", b'{"text": "forbidden", "n": 2}', None),
    ("application/json", b'{"text": "hello", "n": "2"}', None),
    ("application/json", b'{"text": "hello", "n": true}', None),
    ("application/json", b'{"text": "x"', None),  # not JSON
    ("application/json", b"", None),
    ("application/json", b'{"text": "\\ud800"}', None),  # pydantic's JSON mode refuses; FastAPI takes it
    ("application/json", b'\xef\xbb\xbf{"text": "bom"}', None),
    ("application/json", '{"text": "utf-16"}'.encode("utf-16"), None),
    ("text/plain", b'{"text": "hello"}', None),
    ("application/vnd.api+json", b'{"text": "hello"}', None),
    (None, b'{"text": "hello"}', None),
    ("application/json", b'{"text": ""}', "Bearer wrong"),  # both wrong: FastAPI's order
]
LEAN = {0, 1, 2, 3, 4, 5, 6, 10, 11}  # the requests the short path serves (the rest go to FastAPI's handler)


@pytest.fixture
def solved(monkeypatch) -> list[int]:
    """How many times FastAPI's handler ran (it always solves the dependencies)."""
    calls: list[int] = []
    original = fastapi.routing.solve_dependencies

    async def counting(*args, **kwargs):
        calls.append(1)
        return await original(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    return calls


async def answers(app: FastAPI, request: tuple) -> tuple:
    content_type, body, authorization = request
    headers = {k: v for k, v in (("content-type", content_type), ("authorization", authorization)) if v}
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post("/echo", content=body, headers=headers)
    return response.status_code, response.content, sorted(response.headers.items())


@pytest.mark.asyncio
@pytest.mark.parametrize("index", range(len(REQUESTS)))
async def test_lean_answers_as_fastapi(index, solved):
    plain = await answers(twin(fastapi.routing.APIRoute), REQUESTS[index])
    plain_solved, solved[:] = len(solved), []
    lean = await answers(twin(LeanRoute), REQUESTS[index])
    assert lean == plain
    # The short path never solves dependencies; the rest is FastAPI's handler, step for step.
    assert len(solved) == (0 if index in LEAN else plain_solved)
    assert index not in LEAN or plain_solved


def test_plain_json_content_types():
    assert is_plain_json("application/json") and is_plain_json(" application/JSON ; charset=utf-8")
    assert not any(map(is_plain_json, [None, "", "text/json", "application/json-patch+json", "text/plain"]))


def test_other_shapes_keep_fastapis_handler():
    router = APIRouter(route_class=LeanRoute)

    @router.post("/q", response_model=Out)
    async def with_query(body: Body, limit: int = 1) -> object:  # a query parameter
        return body

    @router.post("/sync", response_model=Out)
    def sync(body: Body) -> object:  # runs in a thread pool
        return body

    @router.post("/background", response_model=Out)
    async def background(body: Body, tasks: BackgroundTasks) -> object:
        return body

    for route in router.routes:
        handler = route.get_route_handler()
        assert handler.__qualname__.startswith("get_request_handler"), route.path


@pytest.mark.asyncio
async def test_task_routes_take_the_short_path(models_dir, solved):
    async with serving(models_dir, api_key="k3y") as (_, client):
        solved.clear()
        auth = {"authorization": "Bearer k3y"}
        for path, body in [
            ("/classify", {"text": "a fine day"}),
            ("/embed", {"inputs": ["a fine day", "rain"]}),
            ("/v1/embeddings", {"input": "a fine day"}),
            ("/tokenize", {"inputs": "a fine day"}),
        ]:
            response = await client.post(path, json=body, headers=auth)
            assert response.status_code == 200, (path, response.text)
            assert response.headers["x-request-id"]
        assert not solved
        refused = await client.post("/classify", json={"text": "a fine day"})
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        invalid = await client.post("/classify", json={"txt": "a fine day"}, headers=auth)
        assert invalid.status_code == 422 and "txt" in invalid.text
        assert solved, "the 422 is FastAPI's"


def test_app_imports_no_private_fastapi_or_starlette_name():
    """Issue 42: a FastAPI release may move its private names at any time; the app uses public ones."""
    import ast
    from pathlib import Path

    import app

    offenders = []
    for path in Path(app.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            package = (getattr(node, "module", None) or "").split(".")[0]
            if isinstance(node, ast.ImportFrom) and package in ("fastapi", "starlette"):
                names = [*node.module.split("."), *(a.name for a in node.names)]
                if any(n.startswith("_") for n in names):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders


async def test_a_large_body_is_validated_off_the_event_loop(monkeypatch):
    """Issue 42: a parse of more than about a millisecond leaves the event loop."""
    import asyncio

    from app.api import lean_route

    threads = []
    real = asyncio.to_thread

    async def spy(func, *args):
        threads.append(len(args[0]))
        return await real(func, *args)

    monkeypatch.setattr(lean_route.asyncio, "to_thread", spy)
    app = twin(LeanRoute)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        small = await client.post("/echo", json={"text": "hi"})
        large = await client.post("/echo", json={"text": "x" * (lean_route.OFF_LOOP_BYTES + 10)})
    assert small.status_code == large.status_code == 200
    assert len(threads) == 1 and threads[0] > lean_route.OFF_LOOP_BYTES
