"""DEVICE=simulated (app/engine/simulated.py): every task answers in the shapes its model would,
through the real front end and engine, with no ONNX session; it is never the default."""

from __future__ import annotations

import numpy as np

from app.engine.simulated import SimulatedRuntime
from app.settings import Settings
from tests.app.conftest import bundle_of, serving

BODIES = {
    "classify": ("/classify", {"text": "a fine film"}),
    "ner": ("/ner", {"text": "Ada Lovelace lived in London"}),
    "multiple-choice": ("/multiple-choice", {"context": "It rained.", "choices": ["wet", "dry"]}),
    "qa": ("/qa", {"question": "Where?", "context": "She lived in London."}),
    "embed": ("/embed", {"inputs": ["one", "two words"]}),
}


def test_the_simulated_device_is_never_the_default() -> None:
    assert Settings.model_fields["device"].default == "auto"


async def test_every_task_answers_on_the_simulated_device(models_dir) -> None:
    async with serving(models_dir, device="simulated", simulated_batch_ms=1.0) as (app, client):
        for task, (path, body) in BODIES.items():
            response = await client.post(path, json=body)
            assert response.status_code == 200, (task, response.text)
            runtime = bundle_of(app, task).runtime.runtimes[0]
            assert isinstance(runtime, SimulatedRuntime) and runtime.batches >= 1
        vectors = (await client.post("/embed", json={"inputs": ["one", "two"]})).json()
        assert np.asarray(vectors).shape[0] == 2


def test_a_batch_takes_its_time_per_batch_size_and_gives_the_output_shapes() -> None:
    class Manifest:
        task, labels = "ner", ["O", "B-PER", "I-PER"]
        outputs = [{"name": "logits", "shape": ["batch", "sequence", 3]}]

    slept: list[float] = []
    runtime = SimulatedRuntime(Manifest(), batch_ms=1.0, batch_size=4, sleep=slept.append)  # type: ignore[arg-type]
    out = runtime.run({"input_ids": np.zeros((5, 7), dtype=np.int64)})
    assert out["logits"].shape == (5, 7, 3)
    assert slept == [0.002]  # 5 rows in batches of 4: two batches' time
