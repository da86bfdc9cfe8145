"""The messages of the Open Inference Protocol's gRPC API (KServe's grpc_predict_v2.proto, package
`inference`), declared here field by field and built at import with protobuf's public descriptor API:
no generated code and no protoc at build time. Field numbers and types are the protocol's; the suite
checks them against Triton's own client's (tests/app/test_grpc.py), so every V2 gRPC client speaks to
this server unchanged. Triton's extra RPCs (streaming, repository, statistics) are not served.
Beside it, gRPC's standard health check (`grpc.health.v1.Health/Check`), which Kubernetes' `grpc`
probes and grpc-health-probe call."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"
F = descriptor_pb2.FieldDescriptorProto
BOOL, INT32, INT64, UINT32, UINT64 = F.TYPE_BOOL, F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_UINT64
FLOAT, DOUBLE, STRING, BYTES = F.TYPE_FLOAT, F.TYPE_DOUBLE, F.TYPE_STRING, F.TYPE_BYTES
REPEATED = "repeated"
PARAMETERS = "map<InferParameter>"  # map<string, InferParameter>

# name -> [(field, number, type or message name, "repeated" | oneof name | "")]; "A.B" is B nested in A.
MESSAGES: dict[str, list[tuple[str, int, Any, str]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, BOOL, "")],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, BOOL, "")],
    "ModelReadyRequest": [("name", 1, STRING, ""), ("version", 2, STRING, "")],
    "ModelReadyResponse": [("ready", 1, BOOL, "")],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [
        ("name", 1, STRING, ""),
        ("version", 2, STRING, ""),
        ("extensions", 3, STRING, REPEATED),
    ],
    "ModelMetadataRequest": [("name", 1, STRING, ""), ("version", 2, STRING, "")],
    "ModelMetadataResponse": [
        ("name", 1, STRING, ""),
        ("versions", 2, STRING, REPEATED),
        ("platform", 3, STRING, ""),
        ("inputs", 4, "ModelMetadataResponse.TensorMetadata", REPEATED),
        ("outputs", 5, "ModelMetadataResponse.TensorMetadata", REPEATED),
    ],
    "ModelMetadataResponse.TensorMetadata": [
        ("name", 1, STRING, ""),
        ("datatype", 2, STRING, ""),
        ("shape", 3, INT64, REPEATED),
    ],
    "ModelInferRequest": [
        ("model_name", 1, STRING, ""),
        ("model_version", 2, STRING, ""),
        ("id", 3, STRING, ""),
        ("parameters", 4, PARAMETERS, ""),
        ("inputs", 5, "ModelInferRequest.InferInputTensor", REPEATED),
        ("outputs", 6, "ModelInferRequest.InferRequestedOutputTensor", REPEATED),
        ("raw_input_contents", 7, BYTES, REPEATED),
    ],
    "ModelInferRequest.InferInputTensor": [
        ("name", 1, STRING, ""),
        ("datatype", 2, STRING, ""),
        ("shape", 3, INT64, REPEATED),
        ("parameters", 4, PARAMETERS, ""),
        ("contents", 5, "InferTensorContents", ""),
    ],
    "ModelInferRequest.InferRequestedOutputTensor": [
        ("name", 1, STRING, ""),
        ("parameters", 2, PARAMETERS, ""),
    ],
    "ModelInferResponse": [
        ("model_name", 1, STRING, ""),
        ("model_version", 2, STRING, ""),
        ("id", 3, STRING, ""),
        ("parameters", 4, PARAMETERS, ""),
        ("outputs", 5, "ModelInferResponse.InferOutputTensor", REPEATED),
        ("raw_output_contents", 6, BYTES, REPEATED),
    ],
    "ModelInferResponse.InferOutputTensor": [
        ("name", 1, STRING, ""),
        ("datatype", 2, STRING, ""),
        ("shape", 3, INT64, REPEATED),
        ("parameters", 4, PARAMETERS, ""),
        ("contents", 5, "InferTensorContents", ""),
    ],
    "InferParameter": [
        ("bool_param", 1, BOOL, "parameter_choice"),
        ("int64_param", 2, INT64, "parameter_choice"),
        ("string_param", 3, STRING, "parameter_choice"),
        ("double_param", 4, DOUBLE, "parameter_choice"),
        ("uint64_param", 5, UINT64, "parameter_choice"),
    ],
    "InferTensorContents": [
        ("bool_contents", 1, BOOL, REPEATED),
        ("int_contents", 2, INT32, REPEATED),
        ("int64_contents", 3, INT64, REPEATED),
        ("uint_contents", 4, UINT32, REPEATED),
        ("uint64_contents", 5, UINT64, REPEATED),
        ("fp32_contents", 6, FLOAT, REPEATED),
        ("fp64_contents", 7, DOUBLE, REPEATED),
        ("bytes_contents", 8, BYTES, REPEATED),
    ],
}
# gRPC's health checking protocol (grpc/health/v1/health.proto): Check only, not the Watch stream.
HEALTH_PACKAGE = "grpc.health.v1"
HEALTH_SERVICE = f"{HEALTH_PACKAGE}.Health"
HEALTH_MESSAGES: dict[str, list[tuple[str, int, Any, str]]] = {
    "HealthCheckRequest": [("service", 1, STRING, "")],
    "HealthCheckResponse": [("status", 1, INT32, "")],  # the ServingStatus enum: a varint on the wire
}
SERVING, NOT_SERVING = 1, 2  # ServingStatus
HEALTH_METHODS = {"Check": ("HealthCheckRequest", "HealthCheckResponse")}
# rpc -> (request, response)
METHODS = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
}


def _field(
    message: descriptor_pb2.DescriptorProto, full: str, name: str, number: int, kind: Any, how: str
) -> None:
    """One field of `message` (whose full name, under the V2 package, is `full`)."""
    field = message.field.add(name=name, number=number, json_name=_camel(name))
    field.label = F.LABEL_REPEATED if how == REPEATED else F.LABEL_OPTIONAL
    if kind == PARAMETERS:  # a map is a repeated nested entry message (key = 1, value = 2)
        entry = message.nested_type.add(name="ParametersEntry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=STRING, label=F.LABEL_OPTIONAL, json_name="key")
        value = entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL)
        value.type_name, value.json_name = f".{PACKAGE}.InferParameter", "value"
        field.label, field.type = F.LABEL_REPEATED, F.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{full}.ParametersEntry"
    elif isinstance(kind, str):
        field.type, field.type_name = F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    else:
        field.type = kind
    if how not in ("", REPEATED):  # a oneof's member
        names = [o.name for o in message.oneof_decl]
        if how not in names:
            message.oneof_decl.add(name=how)
            names.append(how)
        field.oneof_index = names.index(how)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _file(
    name: str, package: str, messages: dict[str, list], service: str, methods: dict[str, tuple[str, str]]
) -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    built: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full, fields in messages.items():  # a nested message is declared after its parent
        parent, _, short = full.rpartition(".")
        message = (built[parent].nested_type if parent else file.message_type).add(name=short)
        built[full] = message
        for field in fields:
            _field(message, full, *field)
    rpcs = file.service.add(name=service.rpartition(".")[2])
    for rpc, (request, response) in methods.items():
        rpcs.method.add(name=rpc, input_type=f".{package}.{request}", output_type=f".{package}.{response}")
    return file


# A private pool: another copy of the protocol in the process (Triton's client's) cannot clash.
POOL = descriptor_pool.DescriptorPool()
POOL.Add(_file("grpc_predict_v2.proto", PACKAGE, MESSAGES, SERVICE, METHODS))
POOL.Add(_file("health.proto", HEALTH_PACKAGE, HEALTH_MESSAGES, HEALTH_SERVICE, HEALTH_METHODS))
CLASSES: dict[str, Any] = {
    name: message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{package}.{name}"))
    for package, messages in ((PACKAGE, MESSAGES), (HEALTH_PACKAGE, HEALTH_MESSAGES))
    for name in messages
    if "." not in name
}
