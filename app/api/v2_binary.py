"""Triton's binary tensor data extension for the V2 routes (app/api/v2_routes.py).

A request body may be a JSON header of `Inference-Header-Content-Length` bytes followed by the
binary inputs, in input order, each `parameters.binary_data_size` bytes long. Outputs asked for as
binary (`binary_data` on an output, or `binary_data_output` for all) come back the same way. Data
are little-endian and row-major; a BYTES element is a 4-byte little-endian length, then its bytes;
BOOL is one byte. Binary inputs are turned into the JSON form's lists here, so everything after
(app/api/v2.py) reads both forms alike.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
from fastapi import Response

from app.api.v2_schemas import V2InferRequest, V2InferResponse
from app.errors import InvalidTensor

HEADER = "Inference-Header-Content-Length"
CONTENT_TYPE = "application/octet-stream"  # a header + binary body, as Triton sends it
SCOPE_KEY = "v2.binary"  # the bytes after the JSON header, set by the route class
NUMERIC = {
    "BOOL": "?",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
LENGTH = 4  # a BYTES element's length prefix


def split_body(body: bytes, header_length: str) -> tuple[bytes, bytes]:
    """The JSON header and the binary data after it."""
    if not re.fullmatch(r"[0-9]{1,19}", header_length.strip()):
        raise InvalidTensor(f"{HEADER} must be a byte count (a non-negative integer), got {header_length!r}")
    size = int(header_length)
    if size == 0:
        raise InvalidTensor(
            f"{HEADER} is 0: a body of raw binary data alone is not supported; send the JSON header"
        )
    if size > len(body):
        raise InvalidTensor(f"{HEADER} is {size}, but the body has only {len(body)} bytes")
    return body[:size], body[size:]


def attach_inputs(request: V2InferRequest, binary: bytes | None) -> None:
    """Fill each binary input's `data` from `binary` (None: the body was JSON alone)."""
    offset = 0
    for tensor in request.inputs:
        where = f"input {tensor.name!r}"
        size = (tensor.parameters or {}).get("binary_data_size")
        if size is None:
            if tensor.data is None:
                raise InvalidTensor(
                    f"{where} has no data: give `data`, or binary data and its binary_data_size"
                )
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidTensor(f"{where}: binary_data_size must be a non-negative integer, got {size!r}")
        if tensor.data is not None:
            raise InvalidTensor(f"{where} has both `data` and binary_data_size: send it one way")
        if binary is None:
            raise InvalidTensor(f"{where} has binary_data_size, but the request has no {HEADER} header")
        if offset + size > len(binary):
            raise InvalidTensor(
                f"{where}: binary_data_size {size} runs past the body: {len(binary) - offset} bytes are left "
                "after the JSON header and the inputs before it"
            )
        tensor.data = from_bytes(where, tensor.datatype, tensor.shape, binary[offset : offset + size])
        offset += size
    if binary is not None and offset != len(binary):
        raise InvalidTensor(
            f"the body has {len(binary)} bytes after the JSON header, but the inputs' binary_data_size "
            f"add up to {offset}"
        )


def from_bytes(where: str, datatype: str, shape: list[int], raw: bytes) -> list[Any]:
    """One tensor's binary data as a flat list of its elements."""
    count = math.prod(shape)
    if datatype == "BYTES":
        elements, offset = [], 0
        while offset < len(raw):
            if offset + LENGTH > len(raw):
                raise InvalidTensor(f"{where}: element {len(elements)}'s 4-byte length prefix is cut off")
            if len(elements) == count:  # refused at once, however many more the data holds
                raise InvalidTensor(
                    f"shape mismatch: {where} has shape {shape}, but its binary data holds more"
                )
            length = int.from_bytes(raw[offset : offset + LENGTH], "little")
            offset += LENGTH
            if offset + length > len(raw):
                raise InvalidTensor(
                    f"{where}: element {len(elements)}'s length prefix says {length} bytes, but only "
                    f"{len(raw) - offset} are left in its binary_data_size"
                )
            try:
                elements.append(raw[offset : offset + length].decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidTensor(f"{where}: element {len(elements)} is not UTF-8 text") from None
            offset += length
        if len(elements) != count:
            raise InvalidTensor(
                f"shape mismatch: {where} has shape {shape}, which holds {count} elements, but its "
                f"binary data holds {len(elements)}"
            )
        return elements
    if datatype not in NUMERIC:
        raise InvalidTensor(
            f"{where}: datatype {datatype} has no binary form; known: BYTES, {', '.join(NUMERIC)}"
        )
    dtype = np.dtype(NUMERIC[datatype])
    if len(raw) != count * dtype.itemsize:
        raise InvalidTensor(
            f"{where}: binary_data_size is {len(raw)} bytes, but shape {shape} of {datatype} "
            f"({dtype.itemsize} bytes each) takes {count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype).tolist()


def binary_outputs(request: V2InferRequest, names: list[str]) -> set[str]:
    """The outputs (of `names`, those answered) to send as binary: `binary_data` on the output,
    else the request's `binary_data_output`."""
    every = flag((request.parameters or {}).get("binary_data_output", False), "parameter binary_data_output")
    asked = {o.name: o.parameters or {} for o in request.outputs or []}
    return {
        name
        for name in names
        if flag(asked.get(name, {}).get("binary_data", every), f"output {name!r}: binary_data")
    }


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidTensor(f"{what} must be true or false, got {value!r}")
    return value


def to_bytes(datatype: str, data: list[Any]) -> bytes:
    if datatype == "BYTES":
        encoded = [str(x).encode("utf-8") for x in data]
        return b"".join(len(e).to_bytes(LENGTH, "little") + e for e in encoded)
    return np.asarray(data, dtype=NUMERIC[datatype]).tobytes()


def binary_response(answer: V2InferResponse, binary: set[str], headers: dict[str, str]) -> Response:
    """The answer as a JSON header and the binary outputs after it, in output order."""
    chunks = []
    for tensor in answer.outputs:
        if tensor.name in binary and tensor.data is not None:
            chunks.append(to_bytes(tensor.datatype, tensor.data))
            tensor.parameters, tensor.data = {"binary_data_size": len(chunks[-1])}, None
    header = answer.model_dump_json(exclude_none=True).encode("utf-8")
    return Response(
        header + b"".join(chunks), media_type=CONTENT_TYPE, headers={**headers, HEADER: str(len(header))}
    )
