"""KServe V2 / Open Inference Protocol for every task: V2 tensors in, the task's own requests out,
and its own answers back as V2 tensors. No HTTP here: the routes are app/api/v2_routes.py.

Each task's tensors are declared once, in its TaskSpec (processing/tasks.py, `v2`). The first
axis of every tensor is the batch: row i of the inputs becomes the task's i-th native request,
validated by the task's own schema (so a V2 request is checked exactly as /classify, /ner, ...
check theirs) and served by its own service; row i of every output is read from the i-th answer.
Request `parameters` are the native request's options (top_k, aggregation, doc_stride, ...) for
every row, plus the schedule: `timeout_ms` and `priority` (high | normal), or Triton's schedule
policy `timeout` (microseconds) and `priority` (1 = highest = high; 0 = default = normal).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from app.api.scheduling import MAX_TIMEOUT_MS, priority_of, timeout_ms_of
from app.api.serving.services import TASK_SCHEMAS
from app.api.serving.task_service import TaskService, Timings
from app.api.v2_schemas import V2InferRequest, V2ModelMetadata, V2OutputTensor, V2TensorMetadata
from app.engine.batch_types import Priority
from app.errors import InvalidTensor, NoModel, RequestError, TooManyInputs
from processing.tasks import TASKS, TaskSpec, Tensor

if TYPE_CHECKING:
    from app.engine.table import Model, ModelTable

SERVER_NAME = "bert-serving"
PLATFORM = "onnx_onnxv1"  # the Open Inference Protocol's name for an ONNX Runtime model
# Server extensions: request `parameters` (Triton's "parameters"), Triton's schedule policy, and
# Triton's binary tensor data (app/api/v2_binary.py).
EXTENSIONS = ["parameters", "schedule_policy", "binary_tensor_data"]
GRPC_EXTENSIONS = EXTENSIONS[:2]  # gRPC's tensors are binary already (raw_input_contents)
# Not options: the model is in the path, the batch is the tensors' first axis (not `inputs`), and
# `parameters` (Hugging Face's envelope on TEI's routes) is this request's own.
NOT_PARAMETERS = {"model", "inputs", "timeout_ms", "priority", "parameters"}
# MLServer's and KServe's codec hint (text is text here), and the binary tensor data extension's
# parameters, which app/api/v2_binary.py has applied before the tensors get here.
IGNORED_PARAMETERS = {"content_type", "binary_data", "binary_data_output", "binary_data_size"}
PYTHON_TYPES = {"BYTES": str, "FP32": float, "INT64": int, "BOOL": bool}
DEFAULTS = {"BYTES": "", "FP32": 0.0, "INT64": 0, "BOOL": False}  # an output whose field is absent


@dataclass
class Decoded:
    """A V2 inference request, as the task's native requests and what to answer."""

    rows: list[BaseModel]
    outputs: list[Tensor]
    timeout_ms: float | None = None
    priority: Priority | None = None


def describe(tensors: Sequence[Tensor]) -> str:
    return ", ".join(
        f"{t.name} ({t.datatype} {list(t.shape)}{', optional' if t.optional else ''})" for t in tensors
    )


def flatten(data: Any, shape: list[int], name: str) -> list[Any]:
    """Tensor data, already flat or nested exactly as its shape, as one row-major list. Ragged
    data, or data nested deeper than the shape, is refused; no recursion, whatever the depth."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(x, list) for x in data):
        return data
    flat: list[Any] = []
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        item, axis = stack.pop()
        if axis == len(shape):
            if isinstance(item, list):
                raise InvalidTensor(f"input {name!r}: its data nests deeper than its shape {shape}")
            flat.append(item)
        elif not isinstance(item, list) or len(item) != shape[axis]:
            got = f"{len(item)} elements" if isinstance(item, list) else json.dumps(item)[:40]
            raise InvalidTensor(
                f"input {name!r}: ragged data: axis {axis} of shape {shape} holds {shape[axis]} elements, "
                f"got {got} (send the data flat, or nested exactly as the shape)"
            )
        else:
            stack.extend((x, axis + 1) for x in reversed(item))
    return flat


def check_shapes(request: V2InferRequest, max_rows: int, max_row_elements: int) -> None:
    """From the tensors' shapes alone, before any data is decoded: zero-sized axes, and more rows
    or elements than any request may hold (a cheap refusal however large the data)."""
    for tensor in request.inputs:
        if not tensor.shape:
            continue  # a rank the task does not take: decode() names the shape it must have
        if tensor.shape[0] == 0:
            raise InvalidTensor(f"the batch is empty: input {tensor.name!r} has shape {tensor.shape}")
        if 0 in tensor.shape:
            shape = tensor.shape
            raise InvalidTensor(f"input {tensor.name!r} has shape {shape}: every axis must be at least 1")
        if tensor.shape[0] > max_rows:
            raise TooManyInputs(
                f"input {tensor.name!r} has {tensor.shape[0]} rows; the limit is {max_rows} "
                "(MAX_BATCH_ITEMS)",
                "inputs",
            )
        if math.prod(tensor.shape[1:]) > max_row_elements:
            raise InvalidTensor(
                f"input {tensor.name!r} has shape {tensor.shape}: more than {max_row_elements} elements a row"
            )


def check_tensor_parameters(parameters: dict[str, Any] | None, where: str) -> None:
    for key in parameters or {}:
        if key not in IGNORED_PARAMETERS:
            raise InvalidTensor(f"{where}: unknown parameter {key!r}")


def decode(spec: TaskSpec, request: V2InferRequest, max_rows: int) -> Decoded:
    """Check the tensors against the task's declaration and build one native request per row."""
    declared = {t.name: t for t in spec.v2.inputs}
    given: dict[str, list[Any]] = {}
    rows: int | None = None
    for tensor in request.inputs:
        want = declared.get(tensor.name)
        if want is None:
            raise InvalidTensor(
                f"unknown input {tensor.name!r}: {spec.name} models take {describe(spec.v2.inputs)}"
            )
        if tensor.name in given:
            raise InvalidTensor(f"input {tensor.name!r} is given twice")
        check_tensor_parameters(tensor.parameters, f"input {tensor.name!r}")
        if tensor.datatype != want.datatype:
            raise InvalidTensor(f"input {tensor.name!r} must be {want.datatype}, got {tensor.datatype}")
        fits = len(tensor.shape) == len(want.shape) and all(
            w in (-1, g) for w, g in zip(want.shape, tensor.shape, strict=True)
        )
        if not fits:
            raise InvalidTensor(
                f"shape mismatch: input {tensor.name!r} must have shape {list(want.shape)} (the first axis "
                f"is the batch), got {tensor.shape}"
            )
        flat = flatten(tensor.data, tensor.shape, tensor.name)
        if len(flat) != math.prod(tensor.shape):
            raise InvalidTensor(
                f"shape mismatch: input {tensor.name!r} has shape {tensor.shape}, which holds "
                f"{math.prod(tensor.shape)} elements, but its data has {len(flat)}"
            )
        kind = PYTHON_TYPES[want.datatype]
        wrong = next((i for i, x in enumerate(flat) if not isinstance(x, kind)), None)
        if wrong is not None:
            raise InvalidTensor(
                f"input {tensor.name!r}: element {wrong} is {json.dumps(flat[wrong])[:40]}, not a "
                f"{want.datatype} value (BYTES elements are JSON strings)"
            )
        if rows is not None and tensor.shape[0] != rows:
            raise InvalidTensor(
                f"shape mismatch: the inputs disagree on the batch size (first axis): {tensor.name!r} has "
                f"{tensor.shape[0]} rows, the inputs before it {rows}"
            )
        rows = tensor.shape[0]
        width = math.prod(tensor.shape[1:])
        given[tensor.name] = (
            flat if len(tensor.shape) == 1 else [flat[i : i + width] for i in range(0, len(flat), width)]
        )
    missing = [t.name for t in spec.v2.inputs if not t.optional and t.name not in given]
    if missing:
        raise InvalidTensor(
            f"missing input {missing[0]!r}: {spec.name} models take {describe(spec.v2.inputs)}"
        )
    assert rows is not None  # the request schema asks for at least one input
    if rows == 0:
        raise InvalidTensor("the batch is empty: the inputs' first axis is 0")
    if rows > max_rows:
        raise TooManyInputs(f"the batch has {rows} rows; the limit is {max_rows} (MAX_BATCH_ITEMS)", "inputs")
    decoded = Decoded(rows=[], outputs=requested_outputs(spec, request))
    options = options_of(spec, request.parameters or {}, decoded)
    schema: type[BaseModel] = TASK_SCHEMAS[spec.name].request
    for row in range(rows):
        body = {**options, **{name: values[row] for name, values in given.items()}}
        try:
            decoded.rows.append(schema.model_validate(body))
        except ValidationError as e:
            raise InvalidTensor(validation_message(e, row, set(given))) from None
    return decoded


def options_of(spec: TaskSpec, parameters: dict[str, Any], decoded: Decoded) -> dict[str, Any]:
    """The request parameters: the schedule into `decoded`, the task's options returned."""
    schema: type[BaseModel] = TASK_SCHEMAS[spec.name].request
    accepted = set(schema.model_fields) - NOT_PARAMETERS - {t.name for t in spec.v2.inputs}
    options = {}
    if "timeout_ms" in parameters and "timeout" in parameters:
        raise InvalidTensor("give the parameter timeout_ms or Triton's timeout (microseconds), not both")
    for key, value in parameters.items():
        if key == "timeout_ms":
            decoded.timeout_ms = timeout_ms_of(value, "parameter timeout_ms")
        elif key == "timeout":  # Triton's, in microseconds
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 < value <= MAX_TIMEOUT_MS * 1000
            ):
                raise InvalidTensor(
                    "parameter timeout (Triton's, in microseconds) must be an integer in "
                    f"(0, {MAX_TIMEOUT_MS * 1000}]"
                )
            decoded.timeout_ms = value / 1000
        elif key == "priority":
            decoded.priority = triton_priority(value)
        elif key in IGNORED_PARAMETERS:
            continue
        elif key in accepted:
            options[key] = value
        else:
            known = sorted(accepted | {"timeout_ms", "timeout", "priority"})
            raise InvalidTensor(f"unknown parameter {key!r}; {spec.name} models take {', '.join(known)}")
    return options


def triton_priority(value: object) -> Priority:
    """`high` / `normal`, or Triton's levels: 1 is the highest (high); 0, the default, and 2+ normal."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return Priority.HIGH if value == 1 else Priority.NORMAL
    return priority_of(value, "parameter priority")


def validation_message(error: ValidationError, row: int, inputs: set[str]) -> str:
    problems = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        message = str(item["msg"]).removeprefix("Value error, ")
        if loc and loc[0] in inputs:
            where = f"input {loc[0]!r} row {row}" + (f" element {loc[1]}" if len(loc) > 1 else "")
        elif loc:
            where = f"parameter {'.'.join(loc)!r}"
        else:
            where = f"row {row}"
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


def requested_outputs(spec: TaskSpec, request: V2InferRequest) -> list[Tensor]:
    declared = {t.name: t for t in spec.v2.outputs}
    if request.outputs is None:
        return [t for t in spec.v2.outputs if not t.optional]
    chosen: list[Tensor] = []
    for output in request.outputs:
        if output.name not in declared:
            raise InvalidTensor(
                f"unknown output {output.name!r}: {spec.name} models answer {describe(spec.v2.outputs)}"
            )
        if declared[output.name] in chosen:
            raise InvalidTensor(f"output {output.name!r} is requested twice")
        check_tensor_parameters(output.parameters, f"output {output.name!r}")
        chosen.append(declared[output.name])
    return chosen


async def answer_outputs(
    service: TaskService, rows: list[BaseModel], outputs: list[Tensor], timings: Timings
) -> list[V2OutputTensor]:
    """The requested outputs, each from the answers of the service method that gives it (the service
    itself, or e.g. EmbedService.embed_all for token_embeddings), each method run once."""
    methods = list(dict.fromkeys(t.method for t in outputs))
    answers = {m: await infer_rows(getattr(service, m) if m else service, rows, timings) for m in methods}
    encoded = {m: encode([t for t in outputs if t.method == m], answers[m]) for m in methods}
    by_name = {tensor.name: tensor for tensors in encoded.values() for tensor in tensors}
    return [by_name[t.name] for t in outputs]


async def infer_rows(service: TaskService, rows: list[BaseModel], timings: Timings) -> list[BaseModel]:
    """Serve every row at once (their work items share batches); the first failure cancels the rest.
    A stage's time is the longest row's: the rows run side by side."""
    row_timings = [Timings(timings.schedule) for _ in rows]

    async def one(row: int) -> BaseModel:
        try:
            return await service(rows[row], row_timings[row])
        except RequestError as e:  # name the row; the field already names the input
            raise type(e)(f"row {row}: {e.message}", e.field) from None

    tasks = [asyncio.ensure_future(one(row)) for row in range(len(rows))]
    try:
        answers = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for stage in {stage for t in row_timings for stage in t.stages}:
        timings.add(stage, max(t.stages.get(stage, 0.0) for t in row_timings))
    timings.chars += sum(t.chars for t in row_timings)  # sizes add up (TEI's x-compute-* headers)
    timings.tokens += sum(t.tokens for t in row_timings)
    return list(answers)


def lookup(answer: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if isinstance(answer, list):
            index = int(part)
            answer = answer[index] if index < len(answer) else None
        elif isinstance(answer, dict):
            answer = answer.get(part)
        if answer is None:
            return None
    return answer


def element(tensor: Tensor, value: Any) -> Any:
    if value is None:
        return DEFAULTS[tensor.datatype]
    if tensor.datatype == "BYTES" and not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return PYTHON_TYPES[tensor.datatype](value)


def encode(outputs: list[Tensor], answers: list[BaseModel]) -> list[V2OutputTensor]:
    """Row i of every output from answer i; list-valued fields (scores per choice) add an axis."""
    dumps = [answer.model_dump() for answer in answers]
    tensors = []
    for tensor in outputs:
        values = [lookup(d, tensor.path) for d in dumps]
        if len(tensor.shape) == 1:
            shape, data = [len(values)], [element(tensor, v) for v in values]
        else:
            width = len(values[0])
            if any(len(v) != width for v in values):  # the request's choices tensor is rectangular
                raise RuntimeError(f"output {tensor.name!r} has rows of different lengths")
            shape, data = [len(values), width], [element(tensor, x) for v in values for x in v]
        tensors.append(V2OutputTensor(name=tensor.name, datatype=tensor.datatype, shape=shape, data=data))
    return tensors


def model_at(registry: ModelTable, name: str, version: str | None) -> Model:
    """The model `name`; a request naming a version asks for that one: only the version in service
    can answer."""
    model = registry.resolve(None, name)
    serving = model.current.version if model.current is not None else None
    if version is not None and version != serving:
        raise NoModel.not_serving(model.name, version, serving)
    return model


def model_metadata(model: Model) -> V2ModelMetadata:
    def meta(tensors: Sequence[Tensor]) -> list[V2TensorMetadata]:
        return [V2TensorMetadata(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in tensors]

    assert model.task is not None  # the registry serves no model whose task it could not read
    spec = TASKS[model.task]
    return V2ModelMetadata(
        name=model.name,
        versions=[model.current.version] if model.current is not None else [],
        platform=PLATFORM,
        inputs=meta(spec.v2.inputs),
        outputs=meta(spec.v2.outputs),
    )
