"""Counts before parsing: a large JSON body's lists are counted from its bytes before pydantic
builds a Python object of it.

pydantic validates a list whole before any limit is checked, at tens of MB/s and holding the GIL:
a 900 kB /classify of 56k inputs cost 260-350 ms of CPU to be refused, and a V2 JSON body of
200k rows 100 ms. Here msgspec scans the body into raw slices (no objects but one per element of
the lists it counts), a few ms for 1 MB:
- every top-level list of texts, objects or lists (a list of numbers is token ids, one input)
  holds at most MAX_BATCH_ITEMS elements (choices have their own, lower limit, checked later);
- a V2 body's tensor shapes pass the V2 route's own shape checks, its `data` never decoded.
A body that is not a JSON object, or whose types are wrong, passes: the route words that error.
"""

from __future__ import annotations

import re

import msgspec

from app.api.v2 import check_shapes
from app.errors import RequestError, TooManyInputs

# Smaller bodies validate within about a millisecond anyway (app/api/lean_route.py).
PRECOUNT_BYTES = 32 << 10
GZIP_MAGIC = b"\x1f\x8b"  # JSON, and V2's JSON header, never start so
V2_INFER = re.compile(r"/v2/models/[^/]+(/versions/[^/]+)?/infer")
V2_HEADER_LENGTH = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() takes "²", int() does not
ITEM_STARTS = (ord('"'), ord("{"), ord("["))


class _Tensor(msgspec.Struct):
    name: str = ""
    shape: list[int] = []


class _V2Request(msgspec.Struct):
    inputs: list[_Tensor] = []


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ELEMENTS = msgspec.json.Decoder(list[msgspec.Raw])
_V2 = msgspec.json.Decoder(_V2Request)


def oversized_list(body: bytes, limit: int) -> TooManyInputs | None:
    try:
        top = _TOP.decode(body)
        for field, raw in top.items():
            view = memoryview(raw)
            if not view or view[0] != ord("["):
                continue
            elements = _ELEMENTS.decode(raw)
            if len(elements) > limit and memoryview(elements[0])[0] in ITEM_STARTS:
                return TooManyInputs(
                    f"{field} has {len(elements)} items; no list in a request may hold more than "
                    f"{limit} (MAX_BATCH_ITEMS)",
                    field,
                )
    except (msgspec.DecodeError, RecursionError):  # nesting too deep: pydantic words it
        return None
    return None


def v2_shapes(body: bytes, max_rows: int, max_row_elements: int) -> RequestError | None:
    try:
        check_shapes(_V2.decode(body), max_rows, max_row_elements)  # type: ignore[arg-type]
    except RequestError as e:  # InvalidTensor, TooManyInputs: as the route would refuse it
        return e
    except (msgspec.DecodeError, RecursionError):  # nesting too deep: pydantic words it
        return None
    return None


def v2_header_length(path: str, value: str) -> int | None:
    """The JSON header length a V2 binary request declares (`value`, its
    Inference-Header-Content-Length), or None where `path` is no V2 infer or `value` no plain number."""
    return int(value) if V2_INFER.fullmatch(path) and V2_HEADER_LENGTH.fullmatch(value) else None


def precount(path: str, body: bytes, max_items: int, max_choices: int) -> RequestError | None:
    """The error that refuses `body` (a JSON request to `path`) from its counts alone, or None."""
    if path.startswith("/v2/"):
        return v2_shapes(body, max_items, max(max_choices, 1)) if path.endswith("/infer") else None
    return oversized_list(body, max_items)
