"""Issue 42, finding 13: invisible-only text is blank, and a compressed body gets 415."""

from __future__ import annotations

import gzip
import json

import pytest


@pytest.mark.parametrize("text", ["\u200b", "\u200b \u200b\ufeff", "\u2060\u200d\n"])
async def test_text_of_only_invisible_characters_is_blank(served, text):
    _, client = served
    r = await client.post("/classify", json={"text": text})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "text"
    assert (await client.post("/classify", json={"text": "\u200bgood"})).status_code == 200


async def test_a_gzip_body_gets_415(served):
    _, client = served
    body = gzip.compress(json.dumps({"text": "good"}).encode())
    for headers in ({"content-encoding": "gzip"}, {}):
        headers = {"content-type": "application/json", **headers}
        r = await client.post("/classify", content=body, headers=headers)
        assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type", headers
        assert "uncompressed" in r.json()["message"]
