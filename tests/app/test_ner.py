"""NER character offsets on awkward text, and entities across overlapping windows."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np

from tests.app.conftest import bundle_of, serving

AWKWARD = (
    "Jöhn\t\tSmith  🎉 lives in Pâris…  Zoë   Saldaña 👩\u200d👩\u200d👧 café\tMÜLLER,\tnaïve   résumé 😀!"
)
STRATEGIES = ("none", "simple", "first", "average", "max")


class MarkerNER:
    """john -> B-PER, smith -> I-PER, paris -> B-LOC, everything else O (by token id)."""

    def __init__(self, vocab: dict[str, int], labels: list[str]):
        self.marks = {
            vocab["john"]: labels.index("B-PER"),
            vocab["smith"]: labels.index("I-PER"),
            vocab["paris"]: labels.index("B-LOC"),
        }
        self.n_labels, self.outside = len(labels), labels.index("O")

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = inputs["input_ids"]
        logits = np.zeros((*ids.shape, self.n_labels), dtype=np.float32)
        logits[..., self.outside] = 5.0
        for token_id, label in self.marks.items():
            logits[ids == token_id, label] = 10.0
        return {"logits": logits}


def install_marker(app) -> None:
    bundle = bundle_of(app, "ner")
    bundle.batcher.runtime = MarkerNER(bundle.tokenizer.tokenizer.get_vocab(), bundle.manifest.labels)


async def test_offsets_on_accents_emoji_tabs_and_spaces(served):
    _, client = served
    for strategy in STRATEGIES:
        r = await client.post("/ner", json={"text": AWKWARD, "aggregation": strategy})
        assert r.status_code == 200, r.text
        entities = r.json()["entities"]
        assert entities, strategy
        for e in entities:
            assert AWKWARD[e["start"] : e["end"]] == e["text"], (strategy, e)
            assert e["text"] and e["text"] == e["text"].strip(), (strategy, e)  # no edge whitespace
    tokens = (await client.post("/ner", json={"text": AWKWARD, "aggregation": "none"})).json()["entities"]
    starts = [e["start"] for e in tokens]
    assert starts == sorted(set(starts))  # one entry per token, in text order


async def test_exact_entities_in_awkward_text(make_models_dir):
    async with serving(make_models_dir(("ner",))) as (app, client):  # the one model asked
        install_marker(app)
        out = (await client.post("/ner", json={"text": AWKWARD})).json()
        found = [(e["entity"], e["text"]) for e in out["entities"]]
        assert found == [("PER", "Jöhn\t\tSmith"), ("LOC", "Pâris")]
        for e in out["entities"]:
            assert AWKWARD[e["start"] : e["end"]] == e["text"]
        tokens = (await client.post("/ner", json={"text": AWKWARD, "aggregation": "none"})).json()["entities"]
        assert [(e["entity"], e["text"]) for e in tokens] == [
            ("B-PER", "Jöhn"),
            ("I-PER", "Smith"),
            ("B-LOC", "Pâris"),
        ]


async def test_entities_across_windows(make_models_dir):
    """Every occurrence is found once, wherever it falls relative to the window edges."""
    filler = ["the", "a", "cat", "sat", "on", "mat"]
    words: list[str] = []
    expected: list[int] = []
    for n in range(40):
        words += [filler[(n + k) % len(filler)] for k in range(n % 5 + 1)]
        expected.append(len(" ".join(words)) + 1)
        words += ["john", "smith"]
    text = " ".join(words)
    async with serving(make_models_dir(("ner",))) as (app, client):
        install_marker(app)
        out = (await client.post("/ner", json={"text": text})).json()
        assert out["windows"] > 3
        assert [e["start"] for e in out["entities"]] == expected
        assert all(e["text"] == "john smith" and e["entity"] == "PER" for e in out["entities"])


def with_word_split(bundle: Path, target: Path, rule: str | None) -> Path:
    """A copy of the NER bundle whose manifest records `rule` (None: an older bundle, no record)."""
    shutil.copytree(bundle, target)
    manifest = json.loads((target / "bundle.json").read_text())
    manifest.pop("preprocessing", None)
    if rule is not None:
        manifest["preprocessing"] = {"word_split": rule}
    (target / "bundle.json").write_text(json.dumps(manifest))
    return target


WORDY = "j. smith  lives\n\nin paris-the-city, not paris's river; john\nsmith."


def install_initials_marker(app) -> None:
    """As install_marker, and the initial `j` opens a person too."""
    install_marker(app)
    runtime = bundle_of(app, "ner").batcher.runtime
    vocab = bundle_of(app, "ner").tokenizer.tokenizer.get_vocab()
    runtime.marks[vocab["j"]] = runtime.marks[vocab["john"]]


async def test_entities_follow_the_words_the_model_was_trained_on(app_bundles, tmp_path):
    """Under the conll rule `j.` is one word (as `P.` in CoNLL), so `j. smith` is one person;
    hyphenated names stay whole and trailing punctuation or a clitic stays out."""
    models = tmp_path / "models"
    with_word_split(app_bundles["ner"], models / "ner", "conll")
    async with serving(models) as (app, client):
        install_initials_marker(app)
        out = (await client.post("/ner", json={"text": WORDY})).json()
    found = [(e["entity"], e["text"]) for e in out["entities"]]
    assert found == [("PER", "j. smith"), ("LOC", "paris-the-city"), ("LOC", "paris"), ("PER", "john\nsmith")]
    for e in out["entities"]:
        assert WORDY[e["start"] : e["end"]] == e["text"]


async def test_the_bert_rule_splits_every_punctuation_mark(app_bundles, tmp_path):
    models = tmp_path / "models"
    with_word_split(app_bundles["ner"], models / "ner", "bert")
    async with serving(models) as (app, client):
        install_initials_marker(app)
        out = (await client.post("/ner", json={"text": WORDY})).json()
    found = [(e["entity"], e["text"]) for e in out["entities"]]
    assert found[:3] == [("PER", "j"), ("PER", "smith"), ("LOC", "paris")]


async def test_a_bundle_without_a_recorded_rule_loads_and_says_which_it_uses(app_bundles, tmp_path, caplog):
    models = tmp_path / "models"
    with_word_split(app_bundles["ner"], models / "ner", None)
    with caplog.at_level(logging.INFO, logger="app.services"):
        async with serving(models) as (app, client):
            install_initials_marker(app)
            out = (await client.post("/ner", json={"text": WORDY})).json()
    assert [e["text"] for e in out["entities"]][0] == "j. smith"
    notes = [r.getMessage() for r in caplog.records if "records no word_split" in r.getMessage()]
    assert notes and "'conll'" in notes[0]
