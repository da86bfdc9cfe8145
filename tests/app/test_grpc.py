"""The Open Inference Protocol over gRPC (GRPC_PORT, app/api/grpc_v2/): the messages are the protocol's
(Triton's client's own descriptors), every task answers as over V2 HTTP, through Triton's gRPC client
(raw tensors) and typed contents alike, and the service's rules hold: errors as gRPC codes naming the
problem, the key, MAX_IN_FLIGHT, the call's deadline, the message limit, request ids and shutdown."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio
import tritonclient.grpc.aio as triton
from tritonclient.grpc import service_pb2 as triton_pb2
from tritonclient.utils import InferenceServerException

from app.api.grpc_v2 import server as grpc_server
from app.api.grpc_v2.messages import CLASSES, MESSAGES, METHODS, POOL, SERVICE
from benchmarks.bench_common import free_port
from processing.tasks import TASKS
from tests.app.conftest import serving
from tests.app.test_v2 import ROWS, v2_request


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def grpc_served(models_dir):
    port = free_port()
    async with serving(models_dir, grpc_port=port, grpc_host="127.0.0.1") as (app, client):
        yield app, client, f"127.0.0.1:{port}"


class Channel:
    """Raw calls with our own messages: typed contents, undecodable bytes, metadata and trailers."""

    def __init__(self, target: str):
        self.channel = grpc.aio.insecure_channel(target)

    async def call(self, rpc: str, message: Any, **kwargs: Any) -> tuple[Any, grpc.aio.Call]:
        reply = CLASSES[METHODS[rpc][1]].FromString
        stub = self.channel.unary_unary(f"/{SERVICE}/{rpc}", response_deserializer=reply)
        call = stub(message if isinstance(message, bytes) else message.SerializeToString(), **kwargs)
        return await call, call

    async def error(self, rpc: str, message: Any, **kwargs: Any) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await self.call(rpc, message, **kwargs)
        return e.value


def typed_request(model: str, body: dict, **fields: Any) -> Any:
    """A V2 JSON request body as a ModelInferRequest with typed contents (no raw)."""
    message = CLASSES["ModelInferRequest"](model_name=model, **fields)
    for key, value in (body.get("parameters") or {}).items():
        kind = {bool: "bool_param", int: "int64_param", str: "string_param", float: "double_param"}
        setattr(message.parameters[key], kind[type(value)], value)
    for t in body["inputs"]:
        tensor = message.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        flat = np.asarray(t["data"], dtype=object).reshape(-1)
        tensor.contents.bytes_contents.extend(str(x).encode() for x in flat)
    return message


def typed_outputs(reply: Any) -> dict[str, list]:
    out = {}
    for tensor in reply.outputs:
        field = grpc_server.CONTENTS[tensor.datatype]
        values = list(getattr(tensor.contents, field))
        out[tensor.name] = [v.decode() for v in values] if tensor.datatype == "BYTES" else values
    return out


def same(http: list, grpc_values: list, datatype: str) -> bool:
    """HTTP's JSON numbers are the float32 the model gave, widened: compare as float32, exactly."""
    if datatype == "FP32":
        return np.array_equal(np.asarray(http, np.float32), np.asarray(grpc_values, np.float32))
    return list(http) == list(grpc_values)


def test_messages_are_the_protocol_s_field_for_field():
    """Every message and RPC as Triton's client declares them: name, number, type, label, oneof."""

    def fields(descriptor) -> list[tuple]:
        own = [
            (f.name, f.number, f.type, f.is_repeated, f.containing_oneof and f.containing_oneof.name)
            for f in descriptor.fields
        ]
        nested = [(n.name, fields(n)) for n in descriptor.nested_types]
        return sorted(own) + sorted(nested, key=lambda x: x[0])

    for name in [name for name in MESSAGES if "." not in name]:
        ours = POOL.FindMessageTypeByName(f"inference.{name}")
        theirs = triton_pb2.DESCRIPTOR.message_types_by_name[name]
        assert fields(ours) == fields(theirs), name
    service = triton_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == SERVICE
    for rpc, (request, reply) in METHODS.items():
        method = service.methods_by_name[rpc]
        assert (method.input_type.name, method.output_type.name) == (request, reply)


@pytest.mark.parametrize("task", list(TASKS))
async def test_every_task_answers_as_over_v2_http(grpc_served, task):
    _, client, target = grpc_served
    body = v2_request(task, ROWS[task])
    http = await client.post(f"/v2/models/{task}/infer", json=body)
    assert http.status_code == 200, http.text
    expected = {o["name"]: o for o in http.json()["outputs"]}

    # Triton's own client: raw tensors in, raw tensors back
    triton_client = triton.InferenceServerClient(target)
    try:
        inputs = []
        for t in body["inputs"]:
            tensor = triton.InferInput(t["name"], t["shape"], t["datatype"])
            tensor.set_data_from_numpy(np.asarray(t["data"], dtype=object))
            inputs.append(tensor)
        result = await triton_client.infer(task, inputs, request_id="r-1", parameters=body.get("parameters"))
    finally:
        await triton_client.close()
    reply = result.get_response()
    assert (reply.model_name, reply.id) == (task, "r-1") and reply.model_version == http.headers[
        "x-model-version"
    ]
    assert [o.name for o in reply.outputs] == list(expected)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert (
            list(got.shape) == want["shape"]
            and reply.outputs[list(expected).index(name)].datatype == want["datatype"]
        )
        values = [x.decode() if isinstance(x, bytes) else x for x in got.reshape(-1).tolist()]
        assert same(want["data"], values, want["datatype"]), name

    # typed contents in: typed contents back, no raw
    typed, _ = await Channel(target).call("ModelInfer", typed_request(task, body))
    assert not typed.raw_output_contents
    assert [list(o.shape) for o in typed.outputs] == [want["shape"] for want in expected.values()]
    for name, values in typed_outputs(typed).items():
        assert same(expected[name]["data"], values, expected[name]["datatype"]), name


async def test_health_metadata_and_readiness(grpc_served):
    app, client, target = grpc_served
    triton_client = triton.InferenceServerClient(target)
    try:
        assert await triton_client.is_server_live() and await triton_client.is_server_ready()
        assert await triton_client.is_model_ready("ner")
        server = await triton_client.get_server_metadata()
        assert server.name == "bert-serving" and list(server.extensions) == ["parameters", "schedule_policy"]
        meta = await triton_client.get_model_metadata("qa")
        http = (await client.get("/v2/models/qa")).json()
        assert (meta.name, list(meta.versions), meta.platform) == (
            http["name"],
            http["versions"],
            http["platform"],
        )
        for side in ("inputs", "outputs"):
            ours = [
                {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in getattr(meta, side)
            ]
            assert ours == http[side]
        with pytest.raises(InferenceServerException, match="'nope' does not exist"):
            await triton_client.get_model_metadata("nope")
        assert await triton_client.is_model_ready(
            "ner", (await client.get("/v2/models/ner")).json()["versions"][0]
        )
        with pytest.raises(InferenceServerException, match="does not serve version '999'"):
            await triton_client.is_model_ready("ner", "999")
        app.state.service_state.shutting_down = True  # as on SIGTERM: not ready, still answering
        assert not await triton_client.is_server_ready() and await triton_client.is_server_live()
    finally:
        app.state.service_state.shutting_down = False
        await triton_client.close()


def classify_request(**fields: Any) -> Any:
    return typed_request("classify", v2_request("classify", ROWS["classify"]), **fields)


BAD = [
    (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "not a valid ModelInferRequest"),
    (CLASSES["ModelInferRequest"](model_name="nope"), grpc.StatusCode.NOT_FOUND, "'nope' does not exist"),
    (classify_request(model_version="999"), grpc.StatusCode.NOT_FOUND, "does not serve version '999'"),
    (CLASSES["ModelInferRequest"](model_name="classify"), grpc.StatusCode.INVALID_ARGUMENT, "inputs"),
    (
        classify_request(raw_input_contents=[b"x", b"y"]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_input_contents holds 2",
    ),
    (
        CLASSES["ModelInferRequest"](model_name="classify", inputs=[{"name": "text"}] * 10_000),
        grpc.StatusCode.INVALID_ARGUMENT,
        "10000 inputs and 0 requested outputs: classify models take text (BYTES [-1])",
    ),
]


@pytest.mark.parametrize("message, code, needle", BAD)
async def test_malformed_requests_name_the_problem(grpc_served, message, code, needle):
    error = await Channel(grpc_served[2]).error("ModelInfer", message)
    assert error.code() == code and needle in error.details(), error.details()
    trailers = dict(error.trailing_metadata())
    assert trailers["x-request-id"] and trailers["error-code"]


async def test_tensor_errors_are_the_v2_route_s(grpc_served):
    channel = Channel(grpc_served[2])
    wrong_type = classify_request()
    wrong_type.inputs[0].datatype = "FP32"
    error = await channel.error("ModelInfer", wrong_type)
    assert "input 'text' must be BYTES, got FP32" in error.details()
    assert dict(error.trailing_metadata())["error-code"] == "invalid_tensor"
    too_many = typed_request("classify", v2_request("classify", [{"text": "x"}] * 65))
    error = await channel.error("ModelInfer", too_many)
    assert "65 rows; the limit is 64 (MAX_BATCH_ITEMS)" in error.details()
    unknown = classify_request()
    unknown.parameters["top_k"].int64_param = 1
    unknown.parameters["parameters"].string_param = "x"  # Hugging Face's envelope is HTTP's, not an option
    error = await channel.error("ModelInfer", unknown)
    assert "unknown parameter 'parameters'" in error.details()
    empty = classify_request()
    empty.parameters["top_k"].Clear()
    error = await channel.error("ModelInfer", empty)
    assert "parameter 'top_k' has no value" in error.details()
    not_utf8 = classify_request()
    not_utf8.inputs[0].contents.bytes_contents[0] = b"\xff"
    error = await channel.error("ModelInfer", not_utf8)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not UTF-8" in error.details()
    negative = classify_request()
    negative.inputs[0].shape[0] = -2
    error = await channel.error("ModelInfer", negative)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "shape" in error.details()


async def test_request_ids_and_metrics(grpc_served):
    app, client, target = grpc_served
    reply, call = await Channel(target).call(
        "ModelInfer", classify_request(id="7"), metadata=(("x-request-id", "req-42"),)
    )
    assert reply.id == "7" and dict(await call.trailing_metadata())["x-request-id"] == "req-42"
    metrics = (await client.get("/metrics")).text
    endpoint = 'endpoint="/inference.GRPCInferenceService/ModelInfer"'
    assert f'bert_requests_total{{{endpoint},model="classify",status="200"}}' in metrics
    await Channel(target).error("ModelInfer", CLASSES["ModelInferRequest"](model_name="made-up-name"))
    metrics = (await client.get("/metrics")).text
    assert 'endpoint="/inference.GRPCInferenceService/ModelInfer",model="",status="404"' in metrics
    assert "made-up-name" not in metrics


async def test_the_call_s_deadline_is_the_request_s(grpc_served, monkeypatch):
    seen = []
    schedule_for = grpc_server.schedule_for

    def spy(*args):
        schedule = schedule_for(*args)
        seen.append((schedule.timeout_ms, schedule.server))
        return schedule

    monkeypatch.setattr(grpc_server, "schedule_for", spy)
    channel = Channel(grpc_served[2])
    await channel.call("ModelInfer", classify_request(), timeout=5.0)
    assert 4000 < seen[-1][0] <= 5100 and not seen[-1][1]  # grpc-timeout travels rounded up
    with_own = classify_request()
    with_own.parameters["timeout_ms"].int64_param = 200  # the shorter of the two wins
    await channel.call("ModelInfer", with_own, timeout=5.0)
    assert seen[-1] == (200, False)
    await channel.call("ModelInfer", classify_request(), metadata=(("x-timeout-ms", "300"),))
    assert seen[-1] == (300, False)  # as HTTP's X-Timeout-Ms
    triton_client = triton.InferenceServerClient(grpc_served[2])  # its schedule policy: uint64 parameters
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.asarray(["fine"], dtype=object))
    await triton_client.infer("classify", [text], timeout=250_000, priority=1)  # microseconds; 1 = highest
    await triton_client.close()
    assert seen[-1] == (250, False)
    await channel.call("ModelInfer", classify_request())  # no deadline: the server's own (MAX_QUEUE_MS)
    assert seen[-1] == (5000, True)


async def test_triton_s_other_rpcs_are_unimplemented(grpc_served):
    stub = Channel(grpc_served[2]).channel.unary_unary("/inference.GRPCInferenceService/RepositoryIndex")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub(b"")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_the_key_guards_metadata_and_inference_not_health(models_dir):
    port = free_port()
    async with serving(models_dir, grpc_port=port, grpc_host="127.0.0.1", api_key="k1"):
        channel = Channel(f"127.0.0.1:{port}")
        for rpc in ("ServerLive", "ServerReady", "ServerMetadata"):
            await channel.call(rpc, CLASSES[METHODS[rpc][0]]())
        await channel.call("ModelReady", CLASSES["ModelReadyRequest"](name="classify"))
        for rpc, message in [
            ("ModelMetadata", CLASSES["ModelMetadataRequest"](name="classify")),
            ("ModelInfer", classify_request()),
        ]:
            for metadata in [(), (("authorization", "Bearer k2"),)]:
                error = await channel.error(rpc, message, metadata=metadata)
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "API key" in error.details()
            await channel.call(rpc, message, metadata=(("authorization", "Bearer k1"),))


async def test_in_flight_limit_and_message_limit(models_dir):
    port = free_port()
    async with serving(
        models_dir, grpc_port=port, grpc_host="127.0.0.1", max_in_flight=2, max_body_bytes=2048
    ) as (
        app,
        _,
    ):
        channel = Channel(f"127.0.0.1:{port}")
        admission = app.state.service_state.admission
        admission.active["classify"] = 2  # two HTTP requests being served
        error = await channel.error("ModelInfer", classify_request())
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "MAX_IN_FLIGHT" in error.details()
        assert dict(error.trailing_metadata())["retry-after"] == "1"
        admission.active["classify"] = 1
        await channel.call("ModelInfer", classify_request())
        assert admission.active["classify"] == 1  # its slot was given back
        await channel.call(
            "ModelInfer", typed_request("ner", v2_request("ner", ROWS["ner"]))
        )  # another task's
        big = typed_request("classify", v2_request("classify", [{"text": "x" * 3000}]))
        error = await channel.error("ModelInfer", big)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # grpc's own refusal, MAX_BODY_BYTES


async def test_a_port_in_use_stops_startup_and_shutdown_frees_it(models_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(Exception, match=f"GRPC_PORT: cannot listen on 127.0.0.1:{port}"):
            async with serving(models_dir, grpc_port=port, grpc_host="127.0.0.1", ready=False):
                pass
    port = free_port()
    async with serving(models_dir, grpc_port=port, grpc_host="127.0.0.1"):
        await Channel(f"127.0.0.1:{port}").call("ServerLive", CLASSES["ServerLiveRequest"]())
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # nothing listens any more


def test_grpc_takes_a_quarter_of_the_connection_budget():
    from app.api.connections import connection_budget

    assert connection_budget(8, None) == (8, 0)
    assert connection_budget(8, 8001) == (6, 2)


async def test_connections_beyond_grpc_s_share_are_refused(models_dir):
    port = free_port()
    async with serving(models_dir, grpc_port=port, grpc_host="127.0.0.1", max_connections=8):  # gRPC: 2
        channels = []
        for _ in range(3):  # a channel each, on its own connection (no shared subchannel)
            channel = Channel(f"127.0.0.1:{port}")
            channel.channel = grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            channels.append(channel)
        for channel in channels[:2]:
            await channel.call("ServerLive", CLASSES["ServerLiveRequest"]())
        error = await channels[2].error("ServerLive", CLASSES["ServerLiveRequest"](), timeout=5)
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        await channels[0].channel.close()
        await asyncio.sleep(0.2)
        await channels[2].call("ServerLive", CLASSES["ServerLiveRequest"](), timeout=5, wait_for_ready=True)
        for channel in channels[1:]:
            await channel.channel.close()


async def test_a_cancelled_call_drops_its_work_and_gives_its_slot_back(models_dir):
    from tests.app.test_batching import gate, until

    port = free_port()
    async with serving(models_dir, grpc_port=port, grpc_host="127.0.0.1", model_instances=1) as (app, client):
        state, channel = app.state.service_state, Channel(f"127.0.0.1:{port}")
        gated, one = gate(app, "classify"), typed_request("classify", v2_request("classify", [{"text": "x"}]))
        first = asyncio.ensure_future(channel.call("ModelInfer", one))
        await until(gated.entered.is_set)  # holds the model
        second = asyncio.ensure_future(channel.call("ModelInfer", one))
        batcher = app.state.service_state.registry.serving("classify", None).batcher
        await until(lambda: batcher.depth == 1)  # queued behind it
        assert state.admission.active["classify"] == 2
        second.cancel()  # the client gives up
        await until(lambda: state.admission.active["classify"] == 1)  # the server's handler ended
        gated.gate.set()
        reply, _ = await first
        assert reply.model_name == "classify" and state.admission.active["classify"] == 0
        await until(lambda: batcher.depth == 0)
        await asyncio.sleep(0.1)
        assert gated.rows == [1]  # only the first call's batch ran: the cancelled one's was dropped
        metrics = (await client.get("/metrics")).text
        assert 'endpoint="/inference.GRPCInferenceService/ModelInfer",model="",status="499"' in metrics


async def test_grpc_s_health_check_is_readiness(grpc_served):
    app, _, target = grpc_served
    state, channel = app.state.service_state, Channel(target)
    stub = channel.channel.unary_unary(
        "/grpc.health.v1.Health/Check", response_deserializer=CLASSES["HealthCheckResponse"].FromString
    )

    async def check(service: str) -> int:
        return (await stub(CLASSES["HealthCheckRequest"](service=service).SerializeToString())).status

    assert (
        await check("") == await check("inference.GRPCInferenceService") == await check("ner") == 1
    )  # SERVING
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await check("no-such-model")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    state.shutting_down = True
    try:
        assert await check("") == await check("ner") == 2  # NOT_SERVING
    finally:
        state.shutting_down = False
    watch = channel.channel.unary_stream("/grpc.health.v1.Health/Watch")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        async for _ in watch(b""):
            pass
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
