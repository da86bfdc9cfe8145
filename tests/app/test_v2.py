"""KServe V2 / Open Inference Protocol conformance, for every task: server and model metadata,
readiness, inference (the same answers as the native routes, as typed tensors), and malformed
requests answered with the protocol's error body {"error": "..."}."""

from __future__ import annotations

import json

import pytest

from processing.tasks import TASKS
from tests.app.conftest import serving

TEXTS = ["a wonderful, moving film", "dull and far too long"]
# One V2 batch of two rows per task, and the native request of each row.
ROWS = {
    "classify": [{"text": t} for t in TEXTS],
    "ner": [{"text": "John Smith lives in Paris."}, {"text": "Angela Merkel met Macron in Berlin."}],
    "multiple-choice": [
        {
            "context": "the glass fell and it",
            "question": "what happened?",
            "choices": ["broke", "sang", "flew"],
        },
        {"context": "she was thirsty so she", "question": "then?", "choices": ["drank", "slept", "ran"]},
    ],
    "qa": [
        {"question": "where does john live?", "context": "john smith lives in paris, in france."},
        {"question": "who lives in paris?", "context": "john smith lives in paris, in france."},
    ],
    "embed": [{"inputs": "the cat sat on the mat"}, {"inputs": "john lives in paris"}],
    "sparse": [{"inputs": "the cat sat on the mat"}, {"inputs": "john lives in paris"}],
}
OPTIONS = {
    "classify": {"top_k": 1},
    "ner": {"aggregation": "simple"},
    "qa": {"top_k": 2},
    "embed": {"normalize": False},
}


def tensor(name: str, rows: list, datatype: str = "BYTES") -> dict:
    shape = [len(rows), len(rows[0])] if rows and isinstance(rows[0], list) else [len(rows)]
    return {"name": name, "shape": shape, "datatype": datatype, "data": rows}


def v2_request(task: str, rows: list[dict]) -> dict:
    names = [t.name for t in TASKS[task].v2.inputs if t.name in rows[0]]
    body = {"inputs": [tensor(name, [row[name] for row in rows]) for name in names]}
    if task in OPTIONS:
        body["parameters"] = OPTIONS[task]
    return body


def by_name(response: dict) -> dict[str, dict]:
    return {o["name"]: o for o in response["outputs"]}


def assert_v2_error(response, status: int, *needles: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    for needle in needles:
        assert needle in body["error"], (needle, body["error"])
    return body["error"]


async def test_server_metadata_and_health(served, models_dir):
    app, client = served
    meta = (await client.get("/v2")).json()
    assert meta == {
        "name": "bert-serving",
        "version": app.version,
        "extensions": ["parameters", "schedule_policy", "binary_tensor_data"],
    }
    assert (await client.get("/v2/health/live")).json() == {"live": True}
    ready = await client.get("/v2/health/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    async with serving(models_dir, ready=False) as (_, client):  # before the models have loaded
        ready = await client.get("/v2/health/ready")
        assert ready.status_code in (200, 503) and ready.json()["ready"] is (ready.status_code == 200)


@pytest.mark.parametrize("task", list(TASKS))
async def test_model_metadata_and_ready(served, task):
    _, client = served
    version = next(m for m in (await client.get("/models")).json()["models"] if m["name"] == task)["version"]
    meta = (await client.get(f"/v2/models/{task}")).json()
    spec = TASKS[task].v2
    assert meta == {
        "name": task,
        "versions": [version],
        "platform": "onnx_onnxv1",
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in spec.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in spec.outputs],
    }
    assert (await client.get(f"/v2/models/{task}/versions/{version}")).json() == meta
    ready = await client.get(f"/v2/models/{task}/ready")
    assert ready.status_code == 200 and ready.json() == {"name": task, "ready": True}
    assert (await client.get(f"/v2/models/{task}/versions/{version}/ready")).status_code == 200
    assert_v2_error(await client.get(f"/v2/models/{task}/versions/999/ready"), 404, "999", version)
    assert_v2_error(await client.get("/v2/models/nope"), 404, "'nope' does not exist")
    assert_v2_error(await client.get("/v2/models/nope/ready"), 404, "nope")


@pytest.mark.parametrize("task", list(TASKS))
async def test_infer_answers_as_the_native_route_does(served, task):
    rows = ROWS[task]
    _, client = served
    native = []
    for row in rows:
        r = await client.post(TASKS[task].path, json={**row, **OPTIONS.get(task, {})})
        assert r.status_code == 200, r.text
        native.append(r.json())
    r = await client.post(f"/v2/models/{task}/infer", json={**v2_request(task, rows), "id": "req-7"})
    assert r.status_code == 200, r.text
    assert r.headers["x-model"] == task and "inference;dur=" in r.headers["server-timing"]
    body = r.json()
    assert body["model_name"] == task and body["id"] == "req-7" and body["model_version"]
    outputs = by_name(body)
    # every output but those sent only when asked for (token_embeddings), in declared order
    assert list(outputs) == [t.name for t in TASKS[task].v2.outputs if not t.optional]
    for o in outputs.values():
        assert o["shape"][0] == len(rows) and len(o["data"]) == o["shape"][0] * (o["shape"][1:] or [1])[0]
    data = {name: o["data"] for name, o in outputs.items()}
    if task == "classify":
        assert data["label"] == [n["label"] for n in native]
        assert data["score"] == pytest.approx([n["score"] for n in native])
        assert [json.loads(s) for s in data["scores"]] == [n["scores"] for n in native]
        assert data["truncated"] == [False, False] and data["windows"] == [1, 1]
    elif task == "ner":
        assert [json.loads(e) for e in data["entities"]] == [n["entities"] for n in native]
        assert data["windows"] == [n["windows"] for n in native]
    elif task == "multiple-choice":
        assert outputs["scores"]["shape"] == [2, 3] and outputs["scores"]["datatype"] == "FP32"
        assert data["scores"] == pytest.approx([s for n in native for s in n["scores"]])
        assert data["best"] == [n["best"] for n in native]
        assert data["choice"] == [n["choice"] for n in native]
    elif task == "embed":  # one vector per row, as FP32 [rows, width]
        assert outputs["embedding"]["datatype"] == "FP32" and outputs["embedding"]["shape"] == [2, 32]
        assert data["embedding"] == pytest.approx([x for n in native for x in n[0]])
    elif task == "sparse":  # one JSON [{"index", "value"}] per row
        assert [json.loads(row) for row in data["sparse"]] == [n[0] for n in native]
    else:
        best = [n["answers"][0] for n in native]
        assert data["answer"] == [a["text"] for a in best]
        assert data["start"] == [a["start"] for a in best] and data["end"] == [a["end"] for a in best]
        assert data["score"] == pytest.approx([a["score"] for a in best])
        assert [json.loads(a) for a in data["answers"]] == [n["answers"] for n in native]
        assert all(len(json.loads(a)) == 2 for a in data["answers"])  # parameters.top_k reached it


async def test_the_specification_example_request(models_dir):
    """The request exactly as the protocol's specification shows it (HTTP/REST, "Inference Request
    Examples"): its layout, id "42", its Content-Type and Content-Length; first verbatim, to a model
    whose inputs are not input0/input1, then with this model's tensors in the same form."""
    verbatim = b"""{
  "id" : "42",
  "inputs" : [
    {
      "name" : "input0",
      "shape" : [ 2, 2 ],
      "datatype" : "UINT32",
      "data" : [ 1, 2, 3, 4 ]
    },
    {
      "name" : "input1",
      "shape" : [ 3 ],
      "datatype" : "BOOL",
      "data" : [ true ]
    }
  ],
  "outputs" : [
    {
      "name" : "output0"
    }
  ]
}"""
    ours = b"""{
  "id" : "42",
  "inputs" : [
    {
      "name" : "text",
      "shape" : [ 2 ],
      "datatype" : "BYTES",
      "data" : [ "a wonderful, moving film", "dull and far too long" ]
    },
    {
      "name" : "text_pair",
      "shape" : [ 2 ],
      "datatype" : "BYTES",
      "data" : [ "i loved it", "i left early" ]
    }
  ],
  "outputs" : [
    {
      "name" : "score"
    },
    {
      "name" : "label"
    }
  ]
}"""
    headers = {"Content-Type": "application/json"}
    async with serving(models_dir) as (_, client):
        r = await client.post("/v2/models/classify/infer", content=verbatim, headers=headers)
        assert_v2_error(r, 400, "unknown input 'input0'", "text (BYTES [-1])")
        r = await client.post("/v2/models/classify/infer", content=ours, headers=headers)
        assert r.status_code == 200, r.text
        for other in (
            {},
            {"Content-Type": "application/x-www-form-urlencoded"},
        ):  # none (tritonclient), curl -d's
            again = await client.post("/v2/models/classify/infer", content=ours, headers=other)
            assert again.json() == r.json()
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["id"] == "42" and body["model_name"] == "classify"
        assert [o["name"] for o in body["outputs"]] == ["score", "label"]  # what was asked, in that order
        score, label = body["outputs"]
        assert score["datatype"] == "FP32" and score["shape"] == [2] and len(score["data"]) == 2
        assert label["datatype"] == "BYTES" and set(label["data"]) <= {
            "negative",
            "positive",
            "LABEL_0",
            "LABEL_1",
        }
        native = await client.post(
            "/classify",
            json={
                "inputs": [
                    {"text": TEXTS[0], "text_pair": "i loved it"},
                    {"text": TEXTS[1], "text_pair": "i left early"},
                ]
            },
        )
        assert label["data"] == [res["label"] for res in native.json()["results"]]


async def test_nested_and_flat_data_are_the_same_tensor(served):
    rows = ROWS["multiple-choice"]
    nested = v2_request("multiple-choice", rows)
    flat = json.loads(json.dumps(nested))
    choices = next(t for t in flat["inputs"] if t["name"] == "choices")
    choices["data"] = [c for row in choices["data"] for c in row]
    _, client = served
    a = await client.post("/v2/models/multiple-choice/infer", json=nested)
    b = await client.post("/v2/models/multiple-choice/infer", json=flat)
    assert a.status_code == b.status_code == 200 and a.json() == b.json()


def classify_body(**changes) -> dict:
    body = {"inputs": [tensor("text", TEXTS)]}
    body.update(changes)
    return body


BAD = [
    # wrong datatype
    (classify_body(inputs=[tensor("text", [1.0, 2.0], "FP32")]), 400, ["'text' must be BYTES, got FP32"]),
    (classify_body(inputs=[tensor("text", [1, 2])]), 400, ["'text': element 0 is 1", "JSON strings"]),
    # missing input
    (classify_body(inputs=[tensor("text_pair", TEXTS)]), 400, ["missing input 'text'"]),
    ({"inputs": []}, 400, ["inputs"]),
    ({"id": "1"}, 400, ["inputs"]),
    # shape mismatch
    (
        classify_body(inputs=[{**tensor("text", TEXTS), "shape": [3]}]),
        400,
        ["shape mismatch", "[3]", "has 2"],
    ),
    (classify_body(inputs=[{**tensor("text", TEXTS), "shape": [1, 2]}]), 400, ["shape mismatch", "[-1]"]),
    (
        classify_body(inputs=[tensor("text", TEXTS), tensor("text_pair", ["only one"])]),
        400,
        ["shape mismatch", "batch size", "'text_pair' has 1 rows"],
    ),
    (classify_body(inputs=[{**tensor("text", TEXTS), "shape": [-2]}]), 400, ["shape"]),
    (classify_body(inputs=[{**tensor("text", []), "shape": [0], "data": []}]), 400, ["batch is empty"]),
    # names and parameters
    (
        classify_body(inputs=[tensor("txt", TEXTS)]),
        400,
        ["unknown input 'txt'", "text_pair (BYTES [-1], optional)"],
    ),
    (classify_body(inputs=[tensor("text", TEXTS)] * 2), 400, ["given twice"]),
    (classify_body(outputs=[{"name": "logits"}]), 400, ["unknown output 'logits'", "label (BYTES [-1])"]),
    (
        classify_body(inputs=[{**tensor("text", TEXTS), "parameters": {"binary_data_size": 9}}]),
        400,
        ["both `data` and binary_data_size"],
    ),
    (classify_body(parameters={"top_kk": 1}), 400, ["unknown parameter 'top_kk'", "top_k"]),
    (classify_body(parameters={"top_k": 0}), 400, ["parameter 'top_k'", "greater than or equal to 1"]),
    (classify_body(parameters={"top_k": 3}), 400, ["top_k must be between 1 and 2"]),
    (classify_body(parameters={"priority": "urgent"}), 400, ["priority must be one of high, normal"]),
    (classify_body(parameters={"timeout_ms": -5}), 400, ["timeout_ms"]),
    (classify_body(parameters={"timeout": 1.5}), 400, ["microseconds"]),
    (classify_body(inputs=[tensor("text", ["fine", " "])]), 400, ["input 'text' row 1", "whitespace"]),
    (classify_body(inputs=[tensor("text", ["x" * 20_001])]), 413, ["row 0: text has 20001 characters"]),
    (classify_body(inputs=[tensor("text", ["a"] * 65)]), 400, ["65 rows", "MAX_BATCH_ITEMS"]),
    (classify_body(extra=1), 400, ["extra"]),
]


@pytest.mark.parametrize("body, status, needles", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
async def test_malformed_requests_get_v2_errors(served, body, status, needles):
    _, client = served
    assert_v2_error(await client.post("/v2/models/classify/infer", json=body), status, *needles)


async def test_every_task_s_malformed_tensors_name_the_problem(served):
    _, client = served
    mc = v2_request("multiple-choice", ROWS["multiple-choice"])
    mc["inputs"][-1] = {**mc["inputs"][-1], "shape": [6]}  # choices flattened into one axis
    r = await client.post("/v2/models/multiple-choice/infer", json=mc)
    assert_v2_error(r, 400, "'choices' must have shape [-1, -1]")
    mc = v2_request("multiple-choice", [{"context": "c", "choices": ["only one"]}])
    r = await client.post("/v2/models/multiple-choice/infer", json=mc)
    assert_v2_error(r, 400, "input 'choices' row 0", "at least 2")
    r = await client.post("/v2/models/qa/infer", json={"inputs": [tensor("question", ["who?"])]})
    assert_v2_error(r, 400, "missing input 'context'")
    r = await client.post("/v2/models/ner/infer", json={"inputs": [tensor("text", ["x"], "INT64")]})
    assert_v2_error(r, 400, "must be BYTES, got INT64")
    r = await client.post(
        "/v2/models/ner/infer", json=v2_request("ner", ROWS["ner"]) | {"parameters": {"aggregation": "x"}}
    )
    assert_v2_error(r, 400, "parameter 'aggregation'")


async def test_other_failures_under_v2_have_the_v2_body(served):
    _, client = served
    assert_v2_error(await client.post("/v2/models/nope/infer", json=classify_body()), 404, "nope")
    r = await client.post(
        "/v2/models/classify/infer", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_v2_error(r, 400, "JSON")
    r = await client.post("/v2/models/classify/versions/999/infer", json=classify_body())
    assert_v2_error(r, 404, "does not serve version '999'")
    assert_v2_error(await client.get("/v2/nothing/here"), 404)
    assert_v2_error(await client.put("/v2/models/classify/infer", json={}), 405)
    # The native routes keep their own body.
    native = (await client.post("/classify", json={"text": ""})).json()
    assert native["error"] == "invalid_request" and "fields" in native


async def test_v2_requests_are_counted_by_route_not_by_name(models_dir):
    async with serving(models_dir) as (_, client):
        assert (await client.post("/v2/models/classify/infer", json=classify_body())).status_code == 200
        await client.post("/v2/models/made-up-name/infer", json=classify_body())
        metrics = (await client.get("/metrics")).text
        assert (
            'bert_requests_total{endpoint="/v2/models/{name}/infer",model="classify",status="200"} 1.0'
            in metrics
        )
        assert 'bert_requests_total{endpoint="/v2/models/{name}/infer",model="",status="404"} 1.0' in metrics
        assert "made-up-name" not in metrics


async def test_v2_infer_counts_against_its_task_s_in_flight_limit(models_dir):
    from app.api.middleware import inference_task

    async with serving(models_dir) as (app, _):
        scope = {"type": "http", "method": "POST", "app": app}
        assert inference_task({**scope, "path": "/v2/models/qa/infer"}) == "qa"
        assert inference_task({**scope, "path": "/v2/models/qa/versions/3/infer"}) == "qa"
        assert inference_task({**scope, "path": "/v2/models/qa/ready"}) is None
        assert inference_task({**scope, "path": "/v2/models/unknown/infer"}) is None
        assert inference_task({**scope, "path": "/ner"}) == "ner"
