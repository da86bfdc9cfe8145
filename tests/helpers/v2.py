"""V2 (KServe) binary request bodies for the tests."""

from __future__ import annotations

import json
import struct


def zero_length_elements(count: int) -> bytes:
    """`count` BYTES elements of no bytes: four length bytes each, the cheapest flood."""
    return struct.pack("<I", 0) * count


def bytes_request(shape: list[int], data: bytes) -> tuple[bytes, int]:
    """The body of a binary V2 request of one BYTES input `text` of `shape` (its JSON header, then
    `data`, the length-prefixed elements), and the header's length (Inference-Header-Content-Length)."""
    tensor = {
        "name": "text",
        "shape": shape,
        "datatype": "BYTES",
        "parameters": {"binary_data_size": len(data)},
    }
    header = json.dumps({"inputs": [tensor]}).encode()
    return header + data, len(header)
