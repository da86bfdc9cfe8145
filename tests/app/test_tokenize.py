"""/tokenize: TEI's request and answer shape, from any loaded model's own tokenizer."""

from __future__ import annotations

import json

from export.bundle import file_info, load_bundle_manifest, write_manifest
from tests.app.conftest import bundle_of, serving

TEXT = "John Smith lives in Paris [SEP] since 2019."


async def test_tokens_with_ids_and_character_offsets(served):
    app, client = served
    r = await client.post("/tokenize", json={"inputs": TEXT})
    assert r.status_code == 200, r.text
    (tokens,) = r.json()  # one text in, a list of one token list out (as TEI answers)
    tokenizer = bundle_of(app, "ner").tokenizer
    assert [t["id"] for t in tokens] == tokenizer.encode(TEXT).input_ids.tolist()  # what the model reads
    first, *body, last = tokens
    assert first == {
        "id": tokenizer.cls_id,
        "text": "[CLS]",
        "special": True,
        "start": None,
        "stop": None,
    }
    assert last["id"] == tokenizer.sep_id and last["special"] and last["start"] is None
    for token in body:
        assert token["special"] is False and TEXT[token["start"] : token["stop"]] == token["text"]
    # A special token typed in the text is the text's, with its offsets.
    typed = next(t for t in body if t["id"] == tokenizer.sep_id)
    assert typed["text"] == "[SEP]" and TEXT[typed["start"] : typed["stop"]] == "[SEP]"
    assert r.headers["x-model"] in {"classify", "ner", "multiple-choice", "qa"}


async def test_a_batch_without_special_tokens_from_a_named_model(served):
    _, client = served
    r = await client.post(
        "/tokenize", json={"inputs": ["héllo wörld", "Paris"], "add_special_tokens": False, "model": "qa"}
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-model"] == "qa"
    words, paris = r.json()
    assert all(not t["special"] for t in words + paris)
    assert "".join(t["text"] for t in paris).replace("##", "") == "Paris"
    assert words[0]["start"] == 0 and words[-1]["stop"] == len("héllo wörld")


async def test_refusals(served):
    _, client = served
    r = await client.post("/tokenize", json={"inputs": "a", "model": "nope"})
    assert r.status_code == 404 and r.json()["fields"][0]["field"] == "model"
    r = await client.post("/tokenize", json={"inputs": ["a"] * 65})
    assert r.status_code == 422 and r.json()["error"] == "too_many_inputs"
    r = await client.post("/tokenize", json={"inputs": ["a", "x" * 20_001]})
    assert r.status_code == 413 and r.json()["fields"][0]["field"] == "inputs.1"
    for body in ({"inputs": []}, {"inputs": ""}, {"inputs": "a", "add_special_tokens": "yes"}, {}):
        r = await client.post("/tokenize", json=body)
        assert r.status_code == 422, (body, r.text)


async def test_models_with_different_tokenizers_must_be_named(make_models_dir):
    root = make_models_dir(("classify", "ner"))
    config = root / "ner" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "do_lower_case": False}))
    manifest = load_bundle_manifest(root / "ner")
    manifest.tokenizer_files["tokenizer_config.json"] = file_info(config)
    write_manifest(root / "ner", manifest)
    async with serving(root) as (_, client):
        r = await client.post("/tokenize", json={"inputs": "Paris"})
        assert r.status_code == 422 and r.json()["error"] == "model_required", r.text
        assert "2 different tokenizers" in r.json()["message"]
        assert (await client.post("/tokenize", json={"inputs": "Paris", "model": "ner"})).status_code == 200
