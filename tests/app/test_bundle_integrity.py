"""Every file the loader or ONNX Runtime reads is listed in bundle.json with its sha256 and checked;
files it does not list are never read; a malformed manifest fails only its own model (issue 42,
findings 8, 9 and 10)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from tests.app.conftest import serving, wait_ready

SERVED_FILE = "model_int8_rowwise.onnx"  # the CPU default variant


def relist(bundle_dir, name: str, key: str = "variants") -> None:
    """Record `name`'s new size and sha256 in the manifest, as an honest re-export would."""
    path = bundle_dir / name
    manifest = json.loads((bundle_dir / "bundle.json").read_text())
    entries = manifest[key].values() if key == "variants" else [manifest[key][name]]
    for entry in entries:
        if key != "variants" or entry["file"] == name:
            entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            entry["bytes"] = path.stat().st_size
    (bundle_dir / "bundle.json").write_text(json.dumps(manifest))


async def model_states(client) -> dict[str, dict]:
    return {m["name"]: m for m in (await client.get("/models")).json()["models"]}


async def test_onnx_external_data_is_never_read(make_models_dir):
    onnx = pytest.importorskip("onnx")
    models = make_models_dir(("classify", "qa"))
    bundle = models / "classify"
    # The listed ONNX file (its hash recorded) keeps its weights in weights.bin, which no manifest lists.
    proto = onnx.load(str(bundle / SERVED_FILE))
    onnx.save_model(
        proto,
        str(bundle / SERVED_FILE),
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=1024,
    )
    relist(bundle, SERVED_FILE)
    assert (bundle / "weights.bin").stat().st_size > 0
    async with serving(models, ready=False) as (_, client):
        await wait_ready(client)
        classify = (await model_states(client))["classify"]
        assert classify["status"] == "failed" and "external data" in classify["error"]
        assert (await client.post("/qa", json={"question": "who?", "context": "john"})).status_code == 200
        assert (await client.post("/classify", json={"text": "good"})).status_code == 503


async def test_an_unlisted_tokenizer_file_is_never_read(make_models_dir):
    models = make_models_dir(("classify",))
    bundle = models / "classify"
    manifest = json.loads((bundle / "bundle.json").read_text())
    assert "vocab.txt" in manifest["tokenizer_files"]
    manifest["tokenizer_files"].pop("tokenizer.json", None)
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    # An unlisted tokenizer.json that would fail (or change) the model if anything opened it.
    (bundle / "tokenizer.json").write_text("{this is not the tokenizer")
    async with serving(models) as (_, client):
        r = await client.post("/tokenize", json={"inputs": "good movie"})
        assert r.status_code == 200 and [t["text"] for t in r.json()[0]][1:3] == ["good", "movie"]


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


MALFORMED = {  # name -> (change to bundle.json, phrase the model's error names)
    "tokenizer_entry_not_an_object": (lambda m: m["tokenizer_files"].update({"vocab.txt": 5}), "vocab.txt"),
    "labels_not_a_list": (lambda m: m.update(labels="positive"), "labels"),
    "max_seq_len_a_bool": (lambda m: m.update(max_seq_len=True), "max_seq_len"),
    "max_seq_len_absurd": (lambda m: m.update(max_seq_len=3_000_000), "max_seq_len"),
    "variant_not_an_object": (lambda m: m["variants"].update({"fp32": 5}), "fp32"),
    "sha256_not_a_string": (lambda m: m["variants"]["fp32"].update(sha256=7), "sha256"),
    "inputs_not_a_list": (lambda m: m.update(inputs={"a": 1}), "inputs"),
    "variants_empty": (lambda m: m.update(variants={}), "no variants"),
}


@pytest.mark.parametrize("case", [*MALFORMED, "nested_100k_deep", "not_json"])
async def test_a_malformed_manifest_fails_only_its_model(make_models_dir, case):
    models = make_models_dir(("classify", "qa"))
    path = models / "qa" / "bundle.json"
    if case == "nested_100k_deep":
        path.write_text('{"task": ' + deep(100_000) + "}")
        phrase = "nests deeper"
    elif case == "not_json":
        path.write_text("{not json")
        phrase = "not valid JSON"
    else:
        change, phrase = MALFORMED[case]
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))
    async with serving(models, ready=False) as (_, client):
        await asyncio.wait_for(wait_ready(client), 60)
        qa = (await model_states(client))["qa"]
        assert qa["status"] == "failed" and phrase in qa["error"], qa
        assert (await client.post("/classify", json={"text": "good"})).status_code == 200
