"""A bundle scores the same evaluated offline (ONNX Runtime in the trainer's loop) and through the
live HTTP service (train.evaluate --url), for every task: what the service answers is what the
model scores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.train.tiny_data import write_task_data
from train.evaluate import evaluate_bundle, main, select_examples
from train.live_eval import LIVE_TASKS, ServiceError, evaluate_live

# Words with punctuation inside, as CoNLL has them (`P.`, `U.S.`, `Chester-le-Street`): a service
# that cut them into other words than training's would score differently.
NER_WORDS = ["j.", "u.s.", "new-york", "o'paris", "a.m."]


def write_data(task: str, directory: Path) -> Path:
    path = write_task_data(task, directory, seed=3)
    if task == "ner":
        lines = path.read_text(encoding="utf-8").splitlines()
        n = 0
        for i, line in enumerate(lines):
            if line.startswith("lives "):
                lines[i] = f"{NER_WORDS[n % len(NER_WORDS)]} NN I-NP B-MISC"
                n += 1
        path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("task", list(LIVE_TASKS))  # embed is scored by benchmarks/embed_quality.py
def test_live_service_scores_what_the_bundle_scores(task, app_bundles, keyless_live, tmp_path):
    data = write_data(task, tmp_path)
    _, examples = select_examples(task=task, data=data)
    offline = evaluate_bundle(app_bundles[task], "fused", task, examples, threads=1)
    online = evaluate_live(keyless_live.url, task, examples, concurrency=8, progress=False)
    offline.pop("seconds")
    offline.pop("token_accuracy", None)  # NER's raw B-/I- tag accuracy: entities do not carry it
    assert online == pytest.approx(offline, abs=1e-9)


def test_the_held_out_slice_of_a_training_run_is_evaluated(app_bundles, keyless_live, tmp_path, capsys):
    data = write_data("qa", tmp_path)
    train_options = ["--task", "qa", "--train", str(data), "--validation-fraction", "0.25", "--seed", "5"]
    task, held_out = select_examples(train_options)
    assert task == "qa" and 0 < len(held_out) < 24
    metrics = main(["--url", keyless_live.url, "--no-progress", "--", *train_options])
    assert metrics == evaluate_live(keyless_live.url, "qa", held_out, progress=False)
    assert '"exact_match"' in capsys.readouterr().out


def test_labels_the_model_does_not_know_are_named(keyless_live, tmp_path):
    data = write_data("classify", tmp_path)
    data.write_text(data.read_text().replace("\tpositive", "\t1").replace("\tnegative", "\t0"))
    _, examples = select_examples(task="classify", data=data)
    with pytest.raises(ServiceError, match="--label-names"):
        evaluate_live(keyless_live.url, "classify", examples, progress=False)
    mapped = evaluate_live(
        keyless_live.url, "classify", examples, label_names={"0": "negative", "1": "positive"}, progress=False
    )
    assert 0.0 <= mapped["accuracy"] <= 1.0
