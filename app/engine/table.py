"""The model table: every model by name, the version serving each, and the rules that pick the model
a request names (or its task's default), lease its version, and say whether the service is ready.

The engine's registry (app/engine/registry.py) keeps it and changes it; a front end in its own
process holds a read-only copy the engine's table messages replace (app/api/remote.py). Nothing
here loads or runs a model.

Selection rule: a request's `model` field names a model (its directory in MODELS_DIR); without it,
the task's default serves: DEFAULT_BUNDLES' choice, else the task's only model. Several models of a
task and no default: 422 model_required. An unknown name, or one of another task: 404 no_model,
listing the models there are.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.errors import ModelLoading, ModelRequired, ModelUnavailable, NoModel
from app.settings import Settings

if TYPE_CHECKING:
    from app.engine.batcher import Batcher
    from app.engine.repository import VersionDir
    from app.engine.runtime import RuntimePool
    from export.bundle import BundleManifest
    from processing.tokenizer import TextTokenizer

HISTORY = 20  # version events kept per model for /models


@dataclass
class Bundle:
    """One version of a model, loaded: what a request is served by from start to end."""

    name: str  # the model's name (its directory in MODELS_DIR)
    version: str
    path: Path
    manifest: BundleManifest
    digest: str = ""
    signature: tuple = ()  # the files it was loaded from (repository.VersionDir.signature)
    variant: str | None = None
    variant_reason: str | None = None  # why this variant (app.engine.runtime.variant_choice)
    device: str | None = None
    threads: int | None = None
    tokenizer: TextTokenizer | None = None
    runtime: RuntimePool | None = None
    batcher: Batcher | None = None
    service: Any = None  # the front end's service for this version (made by ModelControl.make_service)
    load_seconds: float | None = None
    memory_bytes: int | None = None
    leases: int = 0  # requests being served by this version right now
    idle: asyncio.Event | None = None  # set when a retiring version's last request finishes

    @property
    def task(self) -> str:
        return self.manifest.task


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class VersionEvent:
    """One version's fate, as /models reports it."""

    version: str
    path: str
    status: str  # loading | serving | retiring | retired | rejected
    digest: str | None = None
    error: str | None = None
    at: str = field(default_factory=utc_now)


ROOT_TASKS = ("embed", "sparse", "classify")  # whose default POST / serves, in this order


@dataclass
class Model:
    name: str
    task: str | None = None
    status: str = "pending"  # pending | loading | ready | failed | unloading | unloaded
    error: str | None = None  # why no version serves (failed / unloaded)
    current: Bundle | None = None
    reranker: bool = False  # its manifest's role, known from discovery on (see Registry.default_name)
    history: list[VersionEvent] = field(default_factory=list)
    seen: tuple = ()  # the repository fingerprint of the last load attempt (for the poller)
    # Readiness waits for it: found at start-up, or it has served since (not unloaded since).
    required: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def event(self, version: VersionDir | Bundle, status: str, error: str | None = None) -> None:
        path = str(version.path)
        live = ("loading", "serving", "retiring")  # a version's record moves on until it ends
        for record in self.history:
            if (record.version, record.path) == (version.version, path) and record.status in live:
                record.status, record.error, record.at = status, error, utc_now()
                return
        digest = version.digest if isinstance(version, Bundle) else None
        self.history.insert(0, VersionEvent(version.version, path, status, digest, error))
        del self.history[HISTORY:]


class ModelTable:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.models: dict[str, Model] = {}
        self.default_names: dict[str, str] = {}  # DEFAULT_BUNDLES, resolved to model names
        self.device: str | None = None
        self.load_finished = False

    def names(self, task: str | None = None) -> list[str]:
        return [
            n for n, m in self.models.items() if m.status != "unloaded" and (task is None or m.task == task)
        ]

    def default_name(self, task: str) -> str | None:
        """DEFAULT_BUNDLES' choice for the task, else its only model; for classify, its only model not
        marked a reranker (a reranker is /rerank's default, and reachable on /classify by name)."""
        if task in self.default_names:
            return self.default_names[task]
        names = self.names(task)
        if task == "classify":
            names = [n for n in names if not self.models[n].reranker] or names
        return names[0] if len(names) == 1 else None

    def resolve(self, task: str | None, name: str | None) -> Model:
        """The model `name` (of `task`, if given), or the task's default."""
        if name is None:
            assert task is not None, "a request for any task must name its model"
            name = self.default_name(task)
            if name is None:
                choices = self.names(task)
                if choices:
                    raise ModelRequired(
                        f"{len(choices)} models serve {task} ({', '.join(choices)}) and none is its default: "
                        f"name one in the 'model' field, or set DEFAULT_BUNDLES={task}=<name>"
                    )
                raise NoModel(f"no model serves {task} (models: {self._listing()})")
        model = self.models.get(name)
        if model is None or model.status == "unloaded":
            state = "is unloaded" if model is not None else "does not exist"
            raise NoModel(f"model {name!r} {state}; models: {self._listing()}")
        if task is not None and model.task != task:
            raise NoModel(
                f"model {name!r} serves {model.task}, not {task}; {task} models: "
                f"{', '.join(self.names(task)) or 'none'}"
            )
        return model

    def reranker(self, name: str | None) -> str:
        """The model reranking requests use: the one named; else DEFAULT_BUNDLES' rerank=; else the
        only classify model marked a reranker; else the classify default if its bundle reads text
        pairs (it records `text_pair`), else the only classify model that does."""
        if name is not None:
            return name
        if "rerank" in self.default_names:
            return self.default_names["rerank"]
        names = self.names("classify")
        rerankers = [n for n in names if self.models[n].reranker]
        if len(rerankers) == 1:
            return rerankers[0]
        if len(rerankers) > 1:
            raise ModelRequired(
                f"{len(rerankers)} models are rerankers ({', '.join(rerankers)}) and none is the default: "
                "name one in the 'model' field, or set DEFAULT_BUNDLES=rerank=<name>"
            )
        readers = [
            n for n in names if (b := self.models[n].current) and b.manifest.preprocessing.get("text_pair")
        ]
        default = self.default_name("classify")
        if default in readers:
            return default
        if len(readers) == 1:
            return readers[0]
        if any(self.models[n].status in ("pending", "loading") for n in names):
            raise ModelLoading("the classify models are still loading; the reranker is not known yet")
        if not names:
            raise NoModel(f"no model serves classify, so none reranks (models: {self._listing()})")
        raise ModelRequired(
            "no default reranker: name a classify model of text pairs in the 'model' field (classify "
            f"models: {', '.join(names)}), or set DEFAULT_BUNDLES=rerank=<name>"
        )

    def root(self, name: str | None) -> Model:
        """The model text-embeddings-inference's default route (POST /) and /info answer for: `name`;
        else the embedding default, the sparse one or the classify one, the first there is."""
        if name is not None:
            return self.resolve(None, name)
        for task in ROOT_TASKS:
            default = self.default_name(task)
            if default is not None:
                return self.resolve(task, default)
        raise NoModel(
            "no embedding, sparse or classify default to answer at the root: name a model in the "
            "'model' field, or use the task's route"
        )

    def _listing(self) -> str:
        return ", ".join(f"{n} ({self.models[n].task})" for n in self.names()) or "none"

    def shared_tokenizer_model(self) -> str:
        """A model to tokenize with when the request names none: any serving one, if they all read
        the same tokenizer files (by sha256); else the request must say which."""
        serving = [m for m in self.models.values() if m.current is not None and m.status != "unloaded"]
        tokenizers = {
            tuple(sorted((f, i.sha256) for f, i in m.current.manifest.tokenizer_files.items()))
            for m in serving
            if m.current is not None
        }
        if len(tokenizers) == 1:
            return serving[0].name
        if not serving:
            raise ModelLoading("no model is serving yet")
        raise ModelRequired(
            f"the models use {len(tokenizers)} different tokenizers: name one in the 'model' field "
            f"({', '.join(m.name for m in serving)})"
        )

    def serving(self, task: str | None, name: str | None = None) -> Bundle:
        """The version serving `name` (or the task's default), without leasing it."""
        model = self.resolve(task, name)
        if model.current is not None:
            return model.current
        if model.status == "failed":
            raise ModelUnavailable(
                f"model {model.name!r} failed to load and is not served; see /models and the logs"
            )
        if model.status == "unloading":
            raise ModelUnavailable(f"model {model.name!r} is being unloaded")
        raise ModelLoading(f"model {model.name!r} is still loading")

    @contextlib.contextmanager
    def lease(
        self, task: str | None, name: str | None = None, version: str | None = None
    ) -> Iterator[Bundle]:
        """Serve one request on the version in service now, whatever swaps happen meanwhile; with
        `version`, only that version may serve (404 otherwise)."""
        bundle = self.serving(task, name)
        if version is not None and version != bundle.version:
            raise NoModel.not_serving(bundle.name, version, bundle.version)
        bundle.leases += 1
        try:
            yield bundle
        finally:
            bundle.leases -= 1
            if bundle.leases == 0 and bundle.idle is not None:
                bundle.idle.set()

    def readiness(self) -> tuple[bool, str, dict[str, str], dict[str, str]]:
        """Ready when every required model serves: those found at start-up (so a replica whose
        bundle fails never takes traffic, and the old replicas keep serving), and any model that has
        served since. A model added later (admin load, MODEL_POLL_S) that fails is named, and
        readiness stays as it was."""
        models = [m for m in self.models.values() if m.status != "unloaded"]
        statuses = {m.name: m.status for m in models}
        errors = {m.name: m.error for m in models if m.status == "failed" and m.error}
        required = [m for m in models if m.required]
        if any(m.status == "failed" and m.current is None for m in required):
            return False, "failed", statuses, errors
        if not self.load_finished or any(m.current is None for m in required):
            return False, "loading", statuses, errors
        return True, "ready", statuses, errors
