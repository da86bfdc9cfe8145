"""Triton's own Python HTTP client (tritonclient) drives the live server's KServe V2 routes: health,
metadata and inference for every task, with its schedule-policy priority and timeout."""

from __future__ import annotations

import json

import numpy as np
import pytest

from processing.tasks import TASKS
from tests.reliability.conftest import AUTH

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a dev dependency")


@pytest.fixture
def client(live):
    triton = httpclient.InferenceServerClient(url=live.url.removeprefix("http://"))
    yield triton
    triton.close()


def text_input(name: str, rows: list) -> object:
    tensor = httpclient.InferInput(name, list(np.shape(rows)), "BYTES")
    tensor.set_data_from_numpy(np.array(rows, dtype=object), binary_data=False)  # the JSON form
    return tensor


def test_health_and_metadata(client):
    assert client.is_server_live(headers=AUTH) and client.is_server_ready(headers=AUTH)
    server = client.get_server_metadata(headers=AUTH)
    assert server["name"] == "bert-serving" and "schedule_policy" in server["extensions"]
    for task, spec in TASKS.items():
        assert client.is_model_ready(task, headers=AUTH)
        meta = client.get_model_metadata(task, headers=AUTH)
        assert [i["name"] for i in meta["inputs"]] == [t.name for t in spec.v2.inputs]
        assert [o["datatype"] for o in meta["outputs"]] == [t.datatype for t in spec.v2.outputs]
    assert not client.is_model_ready("no-such-model", headers=AUTH)


def test_infer_every_task(client):
    texts = ["a wonderful, moving film", "dull and far too long"]
    result = client.infer(
        "classify",
        [text_input("text", texts)],
        outputs=[httpclient.InferRequestedOutput(name, binary_data=False) for name in ("label", "score")],
        request_id="7",
        headers=AUTH,
        priority=1,  # Triton's highest level: high
        timeout=30_000_000,  # microseconds
    )
    response = result.get_response()
    assert response["id"] == "7" and [o["name"] for o in response["outputs"]] == ["label", "score"]
    labels = result.as_numpy("label")
    assert labels.shape == (2,) and result.as_numpy("score").dtype == np.float32

    ner = client.infer("ner", [text_input("text", ["John Smith lives in Paris."])], headers=AUTH)
    assert isinstance(json.loads(ner.as_numpy("entities")[0]), list)

    mc = client.infer(
        "multiple-choice",
        [
            text_input("context", ["the glass fell and it"]),
            text_input("choices", [["broke", "sang", "flew"]]),
        ],
        headers=AUTH,
    )
    scores = mc.as_numpy("scores")
    assert scores.shape == (1, 3) and abs(float(scores.sum()) - 1.0) < 1e-4
    # No outputs named: tritonclient asks for all in binary, and reads BYTES back as bytes, as from Triton.
    assert mc.as_numpy("choice")[0] in (b"broke", b"sang", b"flew")

    qa = client.infer(
        "qa",
        [text_input("question", ["where does john live?"]), text_input("context", ["john lives in paris."])],
        headers=AUTH,
    )
    start, end = int(qa.as_numpy("start")[0]), int(qa.as_numpy("end")[0])
    assert "john lives in paris."[start:end] == qa.as_numpy("answer")[0].decode()


def test_client_errors_carry_the_server_s_message(client):
    with pytest.raises(Exception, match="unknown input 'texts'"):
        client.infer("classify", [text_input("texts", ["a"])], headers=AUTH)
    with pytest.raises(Exception, match="must be BYTES, got INT64"):
        tensor = httpclient.InferInput("text", [1], "INT64")
        tensor.set_data_from_numpy(np.array([3], dtype=np.int64), binary_data=False)
        client.infer("classify", [tensor], headers=AUTH)


def as_values(array) -> list:
    """A result tensor's elements, BYTES as str whichever way they came."""
    return [x.decode() if isinstance(x, bytes) else x for x in array.ravel().tolist()]


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("inputs_binary", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("outputs", ["default", "named", "named-json"], ids=lambda o: f"outputs-{o}")
def test_tritonclient_defaults_answer_as_the_json_path(live, client, task, inputs_binary, outputs):
    """tritonclient at its defaults sends binary inputs and asks for binary outputs (all of them when
    it names none); every combination answers what the plain JSON request does."""
    import httpx

    from tests.app.test_v2 import OPTIONS, ROWS, v2_request

    rows = ROWS[task]
    plain = httpx.post(f"{live.url}/v2/models/{task}/infer", json=v2_request(task, rows), headers=AUTH)
    assert plain.status_code == 200, plain.text
    expected = {o["name"]: o for o in plain.json()["outputs"]}
    tensors = []
    for spec in TASKS[task].v2.inputs:
        if spec.name in rows[0]:
            data = np.array([row[spec.name] for row in rows], dtype=object)
            tensor = httpclient.InferInput(spec.name, list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data, **({} if inputs_binary else {"binary_data": False}))
            tensors.append(tensor)
    asked = None
    if outputs != "default":
        flags = {} if outputs == "named" else {"binary_data": False}
        asked = [httpclient.InferRequestedOutput(name, **flags) for name in expected]
    # A copy: tritonclient writes Inference-Header-Content-Length into the dict it is given.
    result = client.infer(task, tensors, outputs=asked, headers=dict(AUTH), parameters=OPTIONS.get(task))
    response = result.get_response()
    binary = [("binary_data_size" in (o.get("parameters") or {})) for o in response["outputs"]]
    assert binary == [outputs != "named-json"] * len(expected)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert list(got.shape) == want["shape"], name
        if want["datatype"] in ("FP32",):
            assert as_values(got) == pytest.approx(want["data"], rel=1e-6), name
        else:
            assert as_values(got) == want["data"], name
