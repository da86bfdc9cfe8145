"""The front end <-> engine connection: length-prefixed frames over a Unix socket, each one message.

A frame is 4 bytes of big-endian length, then msgpack (msgspec) of [call id, message type, message]:
the dataclasses below and protocol.py's, numpy arrays as an extension type of their dtype, shape and
raw bytes. Decoding builds only those types (never pickle: nothing that arrives can run code).
docs/performance.md §6 has the cost per message.

Besides protocol.py's requests and replies, the control messages below: the engine's model table
(sent on connect and after every change, numbered), a front end's acknowledgement of it, admin
calls, aborts, and failures (an error's code and message, raised again as the same typed error).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from app import errors
from app.engine import batch_types
from app.engine.protocol import EngineReply, EngineRequest
from app.engine.table import VersionEvent

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30
ARRAY = 1  # msgpack extension code of a numpy array


def _encode_extra(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        array = np.ascontiguousarray(obj)
        meta = f"{array.dtype.str}|{','.join(map(str, array.shape))}".encode()
        return msgspec.msgpack.Ext(ARRAY, struct.pack(">H", len(meta)) + meta + array.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot send {type(obj).__name__}")


def _array(code: int, data: memoryview) -> Any:
    if code != ARRAY:
        raise ValueError(f"unknown extension {code}")
    (size,) = struct.unpack_from(">H", data)
    dtype, shape = bytes(data[2 : 2 + size]).decode().split("|")
    dims = tuple(int(n) for n in shape.split(",")) if shape else ()
    return np.frombuffer(data[2 + size :], dtype=np.dtype(dtype)).reshape(dims)  # [shape...], read-only


def _keep_arrays(kind: type, obj: Any) -> Any:
    if kind is np.ndarray and isinstance(obj, np.ndarray):
        return obj
    raise NotImplementedError


_encoder = msgspec.msgpack.Encoder(enc_hook=_encode_extra)
_decoder = msgspec.msgpack.Decoder(ext_hook=_array)


async def send(writer: asyncio.StreamWriter, message: Any) -> None:
    call_id, inner = (message.call_id, message.message) if isinstance(message, Call) else (-1, message)
    body = _encoder.encode((call_id, type(inner).__name__, inner))
    writer.write(HEADER.pack(len(body)) + body)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> Any:
    """The next message; asyncio.IncompleteReadError when the other end closed."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    call_id, kind, payload = _decoder.decode(await reader.readexactly(size))
    message = msgspec.convert(payload, MESSAGES[kind], dec_hook=_keep_arrays)
    return Call(call_id, message) if call_id >= 0 else message


@dataclass(frozen=True)
class Call:
    """A request (EngineRequest, Admin) or its answer (EngineReply, AdminDone, Failure), by call id:
    a request id may repeat (a V2 batch's rows share their request's, and so its schedule)."""

    call_id: int
    message: Any


@dataclass(frozen=True)
class Abort:
    """The client of call `call_id` went away: drop its queued items."""

    call_id: int


@dataclass(frozen=True)
class VersionFacts:
    """What the engine knows of a serving version that the front end reports (/models)."""

    version: str
    path: str
    digest: str
    variant: str | None
    device: str | None
    threads: int | None
    load_seconds: float | None
    memory_bytes: int | None
    provider: str | None
    providers: list[str]
    instances: int | None
    solo_threads: int | None
    max_batch_tokens: int | None
    max_padding_factor: float | None
    variant_reason: str | None = None


@dataclass(frozen=True)
class ModelRow:
    name: str
    task: str | None
    status: str
    error: str | None
    reranker: bool
    history: list[VersionEvent]
    current: VersionFacts | None
    required: bool = False  # readiness waits for it (app/engine/table.py)


@dataclass(frozen=True)
class Table:
    """The engine's model table, whole: the front ends' read-only copy is replaced by each one."""

    serial: int
    models: list[ModelRow]
    default_names: dict[str, str]
    device: str | None
    load_finished: bool


@dataclass(frozen=True)
class Ack:
    serial: int  # this table is applied, and no request of this front end uses a version it dropped


@dataclass(frozen=True)
class Admin:
    op: str  # load | unload | poll
    name: str = ""


@dataclass(frozen=True)
class AdminDone:
    serial: int  # the table that shows its effect (acknowledged by every front end before this)
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    code: str
    message: str
    attrs: dict[str, Any] = field(default_factory=dict)


def failure_of(error: BaseException) -> Failure:
    if isinstance(error, errors.ServiceError):
        attrs = {k: v for k, v in vars(error).items() if isinstance(v, (int, float, str, type(None)))}
        return Failure(type(error).__name__, str(error), attrs)
    return Failure("InternalError", f"the engine failed: {error!r}")


ERROR_CLASSES: dict[str, type[errors.ServiceError]] = {
    cls.__name__: cls
    for module in (errors, batch_types)
    for cls in vars(module).values()
    if isinstance(cls, type) and issubclass(cls, errors.ServiceError)
}


def error_of(failure: Failure) -> errors.ServiceError:
    """The typed error again, with its attributes (app/api/error_table.py maps it to a status)."""
    cls = ERROR_CLASSES.get(failure.code, errors.InternalError)
    error = cls.__new__(cls)
    Exception.__init__(error, failure.message)
    vars(error).update(failure.attrs)
    return error


MESSAGES: dict[str, type] = {
    cls.__name__: cls for cls in (EngineRequest, EngineReply, Abort, Table, Ack, Admin, AdminDone, Failure)
}
