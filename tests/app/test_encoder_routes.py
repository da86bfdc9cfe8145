"""Every task route serves MPNet and ModernBERT bundles (tiny, exported from checkpoints `transformers`
saved): /classify and /embed answer what `transformers` computes on the same tokens; /ner, /qa and
/multiple-choice answer in their shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from export.pipeline import export_bundle
from processing.tokenizer import TextTokenizer
from tests.helpers.encoders import hf_modernbert, hf_mpnet, save_mpnet, save_with_wordpiece
from tests.helpers.tiny import TASK_LABELS

from .conftest import serving

transformers = pytest.importorskip("transformers")

HEADS = {
    "classify": "ForSequenceClassification",
    "ner": "ForTokenClassification",
    "qa": "ForQuestionAnswering",
    "multiple-choice": "ForMultipleChoice",
    "embed": "Model",
}
ARCHITECTURES = {
    "mpnet": ("MPNet", hf_mpnet, save_mpnet),
    "modernbert": ("ModernBert", hf_modernbert, save_with_wordpiece),
}
TEXT = "john smith lives in paris"


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def served_family(request, tmp_path_factory):
    prefix, make, save = ARCHITECTURES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    models = {}
    for task, head in HEADS.items():
        labels = TASK_LABELS.get(task)
        config = {"num_labels": len(labels), "id2label": dict(enumerate(labels))} if labels else {}
        models[task] = make(prefix + head, **config)
        checkpoint = save(models[task], root / "checkpoints" / task)
        export_bundle(checkpoint, root / "models" / task, task=task, variants=("fp32",), max_seq_len=48)
    return root / "models", models


def feeds(directory, text: str) -> dict[str, torch.Tensor]:
    encoding = TextTokenizer.from_dir(directory).encode(text, max_length=48)
    ids = torch.from_numpy(encoding.input_ids)[None]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


async def test_every_task_route_serves_the_architecture(served_family):
    models_dir, models = served_family
    async with serving(models_dir, cpu_variant="fp32") as (_, client):
        classify = (await client.post("/classify", json={"text": TEXT})).json()
        with torch.no_grad():
            probs = torch.softmax(models["classify"](**feeds(models_dir / "classify", TEXT)).logits[0], -1)
        expected = {TASK_LABELS["classify"][i]: float(p) for i, p in enumerate(probs)}
        assert {s["label"]: s["score"] for s in classify["scores"]} == pytest.approx(expected, abs=1e-5)

        vector = (await client.post("/embed", json={"inputs": TEXT, "normalize": False})).json()[0]
        with torch.no_grad():
            states = models["embed"](**feeds(models_dir / "embed", TEXT)).last_hidden_state[0]
        np.testing.assert_allclose(vector, states.mean(0).numpy(), atol=1e-5)

        ner = await client.post("/ner", json={"text": TEXT})
        assert ner.status_code == 200 and isinstance(ner.json()["entities"], list), ner.text
        for entity in ner.json()["entities"]:
            assert TEXT[entity["start"] : entity["end"]] == entity["text"]
        qa = await client.post("/qa", json={"question": "where does john live?", "context": TEXT})
        assert qa.status_code == 200, qa.text
        for answer in qa.json()["answers"]:
            assert TEXT[answer["start"] : answer["end"]] == answer["text"]
        choice = await client.post(
            "/multiple-choice", json={"context": TEXT, "choices": ["yes", "no", "maybe"]}
        )
        assert choice.status_code == 200 and len(choice.json()["scores"]) == 3, choice.text
