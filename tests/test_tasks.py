"""The task registry (processing/tasks.py) is the one declaration every per-side table follows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from processing.tasks import TASK_NAMES, TASK_PATHS, TASKS, TRAINED_TASKS

REPO = Path(__file__).resolve().parent.parent


def test_the_registry_imports_without_torch_or_the_app() -> None:
    code = (
        "import sys; import processing.tasks; "
        "assert not {'torch', 'fastapi', 'app', 'model', 'train'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_the_service_follows_the_registry() -> None:
    from app import settings
    from app.api import middleware
    from app.api.routes import router
    from app.api.serving import services

    assert settings.TASK_NAMES == TASK_NAMES
    assert middleware.TASK_PATHS == TASK_PATHS
    assert set(services.SERVICES) == set(TASK_NAMES) == set(services.TASK_SCHEMAS)
    routes = {route.path: route for route in router.routes if getattr(route, "methods", None) == {"POST"}}
    for spec in TASKS.values():
        route = routes[spec.path]
        assert services.SERVICES[spec.name].task == spec.name
        assert route.body_field is not None
        wire = services.TASK_SCHEMAS[spec.name]
        assert route.body_field.field_info.annotation is wire.request
        replies = getattr(route.response_model, "__args__", None) or (route.response_model,)
        assert set(replies) == set(wire.responses)
        assert route.summary == spec.summary


def test_export_follows_the_registry() -> None:
    from export import bundle
    from export.onnx_export import ARCHITECTURE_TASKS
    from model.architectures import ARCHITECTURES

    assert bundle.TASKS == TASK_NAMES
    # Every architecture's class for each task, as BERT's spelled with its stem (model/architectures.py).
    assert ARCHITECTURE_TASKS == {
        arch.hf_name + head.removeprefix("Bert"): name
        for arch in ARCHITECTURES.values()
        for name, spec in TASKS.items()
        for head in (spec.head, *spec.architectures)
    }
    assert ARCHITECTURE_TASKS["BertModel"] == "embed"  # a base encoder serves sentence embeddings
    inputs, outputs = bundle.task_io("qa")
    assert [i["shape"] for i in inputs] == [["batch", "sequence"]] * 3
    assert {o["name"]: o["shape"] for o in outputs} == {
        "start_logits": ["batch", "sequence"],
        "end_logits": ["batch", "sequence"],
    }
    inputs, outputs = bundle.task_io("multiple-choice")
    assert inputs[0]["shape"] == ["batch", "choices", "sequence"]
    assert bundle.task_io("ner", 9)[1][0]["shape"] == ["batch", "sequence", 9]
    assert bundle.task_io("embed", hidden_size=384)[1][0]["shape"] == ["batch", "sequence", 384]


def test_the_registry_derives_each_task_s_shape_properties() -> None:
    shape = {name: (spec.choices, spec.labelled, spec.per_token) for name, spec in TASKS.items()}
    assert shape == {
        "classify": (False, True, False),
        "ner": (False, True, True),
        "multiple-choice": (True, False, False),
        "qa": (False, False, True),
        "embed": (False, False, True),  # token states, pooled by processing/embed.py
        "sparse": (False, False, False),  # SPLADE reduced in the graph: a weight per vocabulary entry
    }


def test_the_network_and_training_follow_the_registry() -> None:
    from model.bert import TASK_HEADS
    from train import features, live_eval, readers

    for name, spec in TASKS.items():
        assert TASK_HEADS[name].__name__ == spec.head
        # A trained task has a metric, features and a reader; an untrained one (embed) has none.
        assert (
            (name in features.DEFAULT_METRIC) == (name in features.TASK_FEATURES) == (name in readers.FORMATS)
        )
        assert (name in features.TASK_FEATURES) == spec.trained
        if spec.trained:
            assert features.DEFAULT_METRIC[name] == spec.metric is not None
    assert tuple(readers.FORMATS) == TRAINED_TASKS
    assert set(TRAINED_TASKS) < set(TASK_NAMES)
    assert set(live_eval.LIVE_TASKS) <= set(TASK_NAMES)
    assert set(TASK_HEADS) - set(TASK_NAMES) == {"pretrain"}  # training only, never served


def test_a_route_gets_its_task_service_typed() -> None:
    from types import SimpleNamespace

    import pytest

    from app.api.serving.services import ClassifyService, QAService, service_of

    qa = QAService.__new__(QAService)  # no bundle needed to check the lookup
    bundle = SimpleNamespace(name="squad", service=qa)
    assert service_of(bundle, QAService) is qa
    with pytest.raises(TypeError, match="squad serves QAService, not ClassifyService"):
        service_of(bundle, ClassifyService)
