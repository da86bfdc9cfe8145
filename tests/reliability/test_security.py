"""Security: the API key (enforced, compared in constant time), no pickle loading anywhere, the body
size limit, no stack traces in responses.

The container's non-root user is checked in tests/deploy/test_dockerfile.py
(test_serving_stages_run_as_non_root).
"""

from __future__ import annotations

import ast
import hmac
import os
from pathlib import Path

import httpx
import pytest

from tests.app.conftest import serving
from tests.reliability.conftest import API_KEY, AUTH
from tests.reliability.live import ROOT

VALID = {
    "/classify": {"text": "a good film"},
    "/ner": {"text": "John Smith lives in Paris"},
    "/multiple-choice": {"context": "the cat sat", "choices": ["on the mat", "in the river"]},
    "/qa": {"question": "Who lives in Paris?", "context": "John Smith lives in Paris."},
}


# ----------------------------------------------------------------------------- API key


def test_api_key_is_enforced_on_the_live_server(live):
    wrong_same_length = API_KEY[:-1] + ("x" if API_KEY[-1] != "x" else "y")
    refused = {
        "missing": {},
        "wrong": {"Authorization": f"Bearer {wrong_same_length}"},
        "prefix of the key": {"Authorization": f"Bearer {API_KEY[:-1]}"},
        "key plus more": {"Authorization": f"Bearer {API_KEY}0"},
        "other scheme": {"Authorization": f"Basic {API_KEY}"},
        "bare key": {"Authorization": API_KEY},
        "empty bearer": {"Authorization": "Bearer"},
    }
    with httpx.Client(base_url=live.url, timeout=10) as client:
        for path, body in VALID.items():
            for name, headers in refused.items():
                response = client.post(path, json=body, headers=headers)
                assert response.status_code == 401, (path, name, response.text)
                assert response.json()["error"] == "unauthorized"
                assert response.headers["www-authenticate"] == "Bearer"
                assert API_KEY not in response.text
            assert client.post(path, json=body, headers=AUTH).status_code == 200, path
        for name, headers in refused.items():
            assert client.get("/models", headers=headers).status_code == 401, name
        assert client.get("/models", headers=AUTH).status_code == 200
        for probe in ("/health", "/ready", "/metrics", "/openapi.json"):  # probes, scrapers, docs: no key
            assert client.get(probe).status_code == 200, probe


async def test_api_key_is_compared_in_constant_time(models_dir, monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("app.api.auth.hmac.compare_digest", spy)  # the key rule
    async with serving(models_dir, api_key="s3cret") as (_, client):
        wrong = await client.post(
            "/classify", json=VALID["/classify"], headers={"authorization": "Bearer s3creT"}
        )
        right = await client.post(
            "/classify", json=VALID["/classify"], headers={"authorization": "Bearer s3cret"}
        )
    assert (wrong.status_code, right.status_code) == (401, 200)
    assert calls == [(b"s3creT", b"s3cret"), (b"s3cret", b"s3cret")]


# ----------------------------------------------------------------------------- no pickle

SKIP_DIRS = {".venv", "venv", ".git", "__pycache__", "node_modules", "runs", "build", "dist"}
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve"}
UNPICKLERS = {"load", "loads", "Unpickler", "open"}


def python_sources(root: Path) -> list[Path]:
    """Every .py file of the project; skipped folders are pruned, not walked (.venv is large)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [
            d for d in dirs if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
        ]
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return found


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword_is(call: ast.Call, name: str, value: object) -> bool:
    return any(
        k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in call.keywords
    )


def pickle_loads(source: str) -> list[str]:
    """Calls in `source` that can unpickle: pickle-family loads, torch.load without weights_only=True,
    np.load with allow_pickle=True, pandas.read_pickle."""
    found = []
    tree = ast.parse(source)
    pickle_names = set(PICKLE_MODULES)  # plus what `import pickle as pk` calls them
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pickle_names |= {a.asname for a in node.names if a.name in PICKLE_MODULES and a.asname}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PICKLE_MODULES:
            for alias in node.names:
                if alias.name in UNPICKLERS:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        module, _, function = name.rpartition(".")
        if module.split(".")[-1] in pickle_names and function in UNPICKLERS:
            found.append(f"line {node.lineno}: {name}")
        elif name == "torch.load" and not _keyword_is(node, "weights_only", True):
            found.append(f"line {node.lineno}: torch.load without weights_only=True")
        elif name in ("np.load", "numpy.load") and _keyword_is(node, "allow_pickle", True):
            found.append(f"line {node.lineno}: {name}(allow_pickle=True)")
        elif function == "read_pickle":
            found.append(f"line {node.lineno}: {name}")
    return found


def test_the_pickle_scanner_finds_each_pattern():
    bad = """
import pickle, torch, numpy as np, joblib
pickle.load(f)
pickle.loads(b)
torch.load(path)
torch.load(path, weights_only=False)
np.load(path, allow_pickle=True)
joblib.load(path)
pd.read_pickle(path)
import pickle as pk
pk.loads(b)
from pickle import loads
"""
    assert len(pickle_loads(bad)) == 9
    good = """
torch.load(path, map_location="cpu", weights_only=True)
np.load(path)
np.load(path, allow_pickle=False)
json.loads(text)
"""
    assert pickle_loads(good) == []


def test_no_python_source_loads_pickles():
    sources = python_sources(ROOT)
    assert len(sources) > 50 and ROOT / "app" / "main.py" in sources
    texts = {path: path.read_text(encoding="utf-8") for path in sources}
    # Only a file that names one of the patterns can match: the others are not parsed.
    words = (*PICKLE_MODULES, "torch.load", "np.load", "numpy.load", "read_pickle")
    found = {
        str(path.relative_to(ROOT)): hits
        for path, text in texts.items()
        if any(word in text for word in words)
        and (hits := pickle_loads(text))
        and path != Path(__file__).resolve()  # this file spells the patterns out
    }
    assert not found, found


# ----------------------------------------------------------------------------- body limit, stack traces


def test_request_body_limit_on_the_live_server(live):
    limit = 1 << 20
    declared = httpx.post(
        f"{live.url}/ner", content=b" " * (limit + 1), headers={**AUTH, "content-type": "application/json"}
    )
    assert declared.status_code == 413 and declared.json()["error"] == "payload_too_large"

    def chunks():  # no Content-Length: the limit holds on the bytes actually received
        for _ in range(20):
            yield b" " * (64 * 1024)

    streamed = httpx.post(
        f"{live.url}/classify", content=chunks(), headers={**AUTH, "content-type": "application/json"}
    )
    assert streamed.status_code == 413 and streamed.json()["fields"][0]["field"] == "body"
    assert httpx.post(f"{live.url}/ner", json=VALID["/ner"], headers=AUTH).status_code == 200


@pytest.mark.parametrize("where", ["service", "route"])
async def test_internal_errors_carry_no_stack_trace(models_dir, monkeypatch, where):
    secret_path = "/srv/internal/app/secret_module.py"

    async def explode(*args, **kwargs):
        raise ValueError(f"boom at {secret_path} with API_KEY=hunter2")

    async with serving(models_dir) as (app, client):
        if where == "service":
            bundle = app.state.service_state.registry.serving("ner")
            monkeypatch.setattr(bundle, "service", explode)
        else:
            explode_timings = lambda: (_ for _ in ()).throw(KeyError(secret_path))  # noqa: E731
            monkeypatch.setattr("app.api.routes.Timings", explode_timings)
        response = await client.post("/ner", json=VALID["/ner"])
    assert response.status_code == 500 and response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == "internal_error" and body["request_id"] in body["message"]
    for leak in ("Traceback", 'File "', ".py", "/srv", "hunter2", "ValueError", "KeyError"):
        assert leak not in response.text, leak
