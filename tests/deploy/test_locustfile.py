"""The locustfile, run: locust is not installed in CI, so a stand-in `locust` module records what the
file declares and gives each user a client that answers like the service would (or would not)."""

from __future__ import annotations

import importlib.util
import random
import sys
import types
from contextlib import contextmanager

import pytest

from benchmarks import loadgen_payloads
from tests.deploy.files import DEPLOY

LOCUSTFILE = DEPLOY / "loadtest" / "locustfile.py"


class Response:
    def __init__(self, status_code: int, body: object):
        self.status_code, self.body, self.failures = status_code, body, []

    def json(self) -> object:
        return self.body

    def failure(self, message: str) -> None:
        self.failures.append(message)


class Client:
    """Answers every POST with `reply(path, payload)` and keeps the calls."""

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    @contextmanager
    def post(self, path, json, headers, name, catch_response):
        assert catch_response and name == path
        response = self.reply(path, json)
        self.calls.append((path, json, headers, response))
        yield response


def stand_in_locust() -> types.ModuleType:
    locust = types.ModuleType("locust")
    listeners = []

    class FastHttpUser:
        pass

    def task(weight):
        def mark(method):
            method.weight = weight
            return method

        return mark

    locust.FastHttpUser, locust.task = FastHttpUser, task
    locust.between = lambda low, high: (low, high)
    add_listener = lambda listener: listeners.append(listener) or listener  # noqa: E731
    locust.events = types.SimpleNamespace(init=types.SimpleNamespace(add_listener=add_listener))
    locust.listeners = listeners
    return locust


@pytest.fixture
def locustfile(monkeypatch):
    locust = stand_in_locust()
    monkeypatch.setitem(sys.modules, "locust", locust)
    monkeypatch.delenv("LOADTEST_SEED", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file puts the repository root first
    spec = importlib.util.spec_from_file_location("locustfile_under_test", LOCUSTFILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for listener in locust.listeners:  # locust's init event: the payload pools
        listener(environment=None)
    return module


def user_with(locustfile, reply, api_key: str | None, monkeypatch):
    if api_key:
        monkeypatch.setenv("API_KEY", api_key)
    else:
        monkeypatch.delenv("API_KEY", raising=False)
    user = locustfile.InferenceUser()
    user.client = Client(reply)
    user.on_start()
    return user


def test_every_endpoint_is_a_weighted_task_sending_the_shared_payloads(locustfile, monkeypatch):
    tasks = {
        name: method
        for name, method in vars(locustfile.InferenceUser).items()
        if callable(method) and hasattr(method, "weight")
    }
    assert sorted(method.weight for method in tasks.values()) == [15, 20, 25, 40]
    rng = random.Random(0)  # LOADTEST_SEED's default: the pools are the shared generator's payloads
    assert locustfile.POOLS == {
        endpoint: [loadgen_payloads.make_payload(endpoint, rng) for _ in range(locustfile.POOL_SIZE)]
        for endpoint in loadgen_payloads.ENDPOINTS
    }

    user = user_with(locustfile, lambda path, payload: Response(503, {}), "k3y", monkeypatch)
    for name in tasks:
        getattr(user, name)()
    sent = {path for path, _, _, _ in user.client.calls}
    assert sent == set(loadgen_payloads.ENDPOINTS.values())
    endpoints = {path: name for name, path in loadgen_payloads.ENDPOINTS.items()}
    for path, payload, headers, _ in user.client.calls:
        assert payload in locustfile.POOLS[endpoints[path]]
        assert headers == {"Authorization": "Bearer k3y"}
    assert user_with(locustfile, None, None, monkeypatch).headers == {}


def test_errors_and_answers_off_the_schema_count_as_failures(locustfile, monkeypatch):
    def call(reply) -> list[str]:
        user = user_with(locustfile, reply, None, monkeypatch)
        user.call("classify")
        return user.client.calls[0][3].failures

    assert call(lambda path, payload: Response(429, {"error": "overloaded"})) == ["HTTP 429"]
    wrong = {"label": 3}
    problem = loadgen_payloads.validate_response("classify", {}, wrong)
    assert call(lambda path, payload: Response(200, wrong)) == [f"schema: {problem}"]
    valid = {"label": "positive", "score": 0.9, "scores": [{"label": "positive", "score": 0.9}]}
    assert call(lambda path, payload: Response(200, valid)) == []
