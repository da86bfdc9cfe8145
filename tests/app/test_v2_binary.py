"""Triton's binary tensor data extension on /v2/models/{name}/infer, with bodies built by hand: binary
inputs and outputs give the JSON path's answers, and every malformed body gets a 400 that says what
is wrong. tests/reliability/test_v2_client.py drives the same routes with tritonclient itself."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from tests.app.conftest import serving
from tests.app.test_v2 import ROWS, TEXTS, assert_v2_error, by_name, tensor, v2_request

HEADER = "Inference-Header-Content-Length"


def bytes_tensor(strings: list[str]) -> bytes:
    encoded = [s.encode("utf-8") for s in strings]
    return b"".join(struct.pack("<I", len(e)) + e for e in encoded)


def binary_body(request: dict) -> tuple[bytes, dict[str, str]]:
    """`request` (JSON form) with every input's data moved after the JSON header."""
    header = json.loads(json.dumps(request))
    raw = []
    for t in header["inputs"]:
        flat = np.array(t.pop("data"), dtype=object).ravel().tolist()
        raw.append(bytes_tensor(flat))
        t["parameters"] = {**t.get("parameters", {}), "binary_data_size": len(raw[-1])}
    head = json.dumps(header).encode()
    return head + b"".join(raw), {HEADER: str(len(head))}


def read_binary(response) -> dict[str, list]:
    """Every output's elements, read from a binary answer (BYTES as str, numbers as numbers)."""
    size = int(response.headers[HEADER])
    header, rest = json.loads(response.content[:size]), response.content[size:]
    out, offset = {}, 0
    for o in header["outputs"]:
        n = o["parameters"]["binary_data_size"]
        assert "data" not in o
        chunk, offset = rest[offset : offset + n], offset + n
        if o["datatype"] == "BYTES":
            items, i = [], 0
            while i < len(chunk):
                (length,) = struct.unpack_from("<I", chunk, i)
                items.append(chunk[i + 4 : i + 4 + length].decode())
                i += 4 + length
            out[o["name"]] = items
        else:
            dtype = {"FP32": "<f4", "INT64": "<i8", "BOOL": "?"}[o["datatype"]]
            out[o["name"]] = np.frombuffer(chunk, dtype).tolist()
    assert offset == len(rest)
    return out


@pytest.mark.parametrize("task", list(ROWS))
async def test_binary_inputs_and_outputs_answer_as_json_does(served, task):
    request = v2_request(task, ROWS[task])
    _, client = served
    path = f"/v2/models/{task}/infer"
    plain = await client.post(path, json=request)
    assert plain.status_code == 200 and HEADER.lower() not in plain.headers
    expected = {name: o["data"] for name, o in by_name(plain.json()).items()}
    body, headers = binary_body(request)
    r = await client.post(path, content=body, headers=headers)  # binary in, JSON out
    assert r.status_code == 200, r.text
    assert r.json() == plain.json()
    every = {**request, "parameters": {**request.get("parameters", {}), "binary_data_output": True}}
    body, headers = binary_body(every)
    r = await client.post(path, content=body, headers=headers)  # binary in, binary out
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    got = read_binary(r)
    assert list(got) == list(expected)
    for name, values in expected.items():
        assert got[name] == pytest.approx(values), name
    # JSON in, one output binary: `binary_data` on the output wins over binary_data_output.
    name = list(expected)[0]
    outputs = [{"name": n, "parameters": {"binary_data": n == name}} for n in expected]
    r = await client.post(path, json={**every, "outputs": outputs})
    header = json.loads(r.content[: int(r.headers[HEADER])])
    assert [("data" in o) for o in header["outputs"]] == [n != name for n in expected]
    assert by_name(header)[name]["parameters"]["binary_data_size"] == len(r.content) - int(r.headers[HEADER])


def raw_request(inputs: list[tuple[dict, bytes]], header_length: int | str | None = None, tail: bytes = b""):
    head = json.dumps({"inputs": [t for t, _ in inputs]}).encode()
    body = head + b"".join(raw for _, raw in inputs) + tail
    return body, {HEADER: str(len(head) if header_length is None else header_length)}


TEXT = bytes_tensor(TEXTS)
OVERLONG = struct.pack("<I", 100) + b"hello"  # a BYTES element whose length runs past its tensor
TEXT_INPUT = {
    "name": "text",
    "shape": [2],
    "datatype": "BYTES",
    "parameters": {"binary_data_size": len(TEXT)},
}
MALFORMED = {
    "header beyond the body": (raw_request([(TEXT_INPUT, TEXT)], 10_000), ["is 10000", "only"]),
    "header not an integer": (raw_request([(TEXT_INPUT, TEXT)], "12abc"), ["must be a byte count", "12abc"]),
    "negative header": (raw_request([(TEXT_INPUT, TEXT)], "-5"), ["must be a byte count"]),
    "header zero": (raw_request([(TEXT_INPUT, TEXT)], 0), ["is 0"]),
    "header cuts the JSON": (raw_request([(TEXT_INPUT, TEXT)], 20), ["JSON"]),
    "bytes left over": (raw_request([(TEXT_INPUT, TEXT)], tail=b"xyz"), ["add up to", str(len(TEXT))]),
    "size past the body": (
        raw_request([({**TEXT_INPUT, "parameters": {"binary_data_size": len(TEXT) + 8}}, TEXT)]),
        ["runs past the body"],
    ),
    "length prefix past its buffer": (
        raw_request([({**TEXT_INPUT, "shape": [1], "parameters": {"binary_data_size": 9}}, OVERLONG)]),
        ["element 0's length prefix says 100 bytes", "only 5"],
    ),
    "prefix cut off": (
        raw_request(
            [({**TEXT_INPUT, "parameters": {"binary_data_size": len(TEXT) + 2}}, TEXT + b"\x01\x00")]
        ),
        ["length prefix is cut off"],
    ),
    "too few elements": (
        raw_request([({**TEXT_INPUT, "shape": [3]}, TEXT)]),
        ["shape mismatch", "holds 3 elements", "holds 2"],
    ),
    "numeric size not shape x dtype": (
        raw_request(
            [
                (
                    {
                        "name": "text",
                        "shape": [2],
                        "datatype": "INT64",
                        "parameters": {"binary_data_size": 12},
                    },
                    b"\0" * 12,
                )
            ]
        ),
        ["binary_data_size is 12 bytes", "takes 16"],
    ),
    "data and binary": (
        raw_request([({**TEXT_INPUT, "data": TEXTS}, TEXT)]),
        ["both `data` and binary_data_size"],
    ),
    "size not an integer": (
        raw_request([({**TEXT_INPUT, "parameters": {"binary_data_size": "12"}}, TEXT)]),
        ["binary_data_size must be a non-negative integer"],
    ),
    "not UTF-8": (raw_request([(TEXT_INPUT, TEXT[:-1] + b"\xff")]), ["not UTF-8"]),
    "no data at all": (
        raw_request([({k: v for k, v in TEXT_INPUT.items() if k != "parameters"}, b"")]),
        ["no data"],
    ),
    "unknown datatype": (
        raw_request(
            [
                (
                    {
                        "name": "text",
                        "shape": [1],
                        "datatype": "COMPLEX",
                        "parameters": {"binary_data_size": 1},
                    },
                    b"\0",
                )
            ]
        ),
        ["datatype COMPLEX has no binary form"],
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_binary_bodies_get_400_naming_the_problem(served, case):
    (body, headers), needles = MALFORMED[case]
    _, client = served
    r = await client.post("/v2/models/classify/infer", content=body, headers=headers)
    assert_v2_error(r, 400, *needles)
    # The service keeps serving.
    assert (
        await client.post("/v2/models/classify/infer", json={"inputs": [tensor("text", TEXTS)]})
    ).status_code == 200


async def test_binary_size_without_the_header_and_bad_flags(served):
    _, client = served
    body = {"inputs": [{**tensor("text", TEXTS), "parameters": {"binary_data_size": 9}}]}
    r = await client.post("/v2/models/classify/infer", json=body)
    assert_v2_error(r, 400, "both `data` and binary_data_size")
    del body["inputs"][0]["data"]
    r = await client.post("/v2/models/classify/infer", json=body)
    assert_v2_error(r, 400, "no Inference-Header-Content-Length header")
    plain = {"inputs": [tensor("text", TEXTS)]}
    r = await client.post(
        "/v2/models/classify/infer", json={**plain, "parameters": {"binary_data_output": 1}}
    )
    assert_v2_error(r, 400, "binary_data_output must be true or false")
    r = await client.post(
        "/v2/models/classify/infer",
        json={**plain, "outputs": [{"name": "label", "parameters": {"binary_data": "yes"}}]},
    )
    assert_v2_error(r, 400, "output 'label': binary_data must be true or false")


async def test_the_body_limit_holds_for_binary_bodies(models_dir):
    big = bytes_tensor(["x" * 2000] * 40)
    body, headers = raw_request(
        [({**TEXT_INPUT, "shape": [40], "parameters": {"binary_data_size": len(big)}}, big)]
    )
    async with serving(models_dir, max_body_bytes=50_000) as (_, client):
        r = await client.post("/v2/models/classify/infer", content=body, headers=headers)
        assert_v2_error(r, 413, "MAX_BODY_BYTES")
