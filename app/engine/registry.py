"""The models being served, by name: discovery, each task's default, which version serves a request,
readiness, and the device plan every model's sessions share.

A request leases the version serving its model when it is admitted and returns the lease when it is
answered (`lease`); app/engine/control.py swaps versions in and out around those leases.

Selection rule: a request's `model` field names a model (its directory in MODELS_DIR); without it,
the task's default serves: DEFAULT_BUNDLES' choice, else the task's only model. Several models of a
task and no default: 422 model_required. An unknown name, or one of another task: 404 no_model,
listing the models there are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from app.api.cache import ResponseCache
from app.engine.batcher import ComputeSlots
from app.engine.loader import MB, Bundle, SessionPlan
from app.engine.repository import VersionDir, model_versions, scan
from app.engine.runtime import (
    RuntimeConfigError,
    SessionTuning,
    available_providers,
    resolve_device,
    resolve_instances,
    session_threads,
)
from app.errors import (
    ModelLoading,
    ModelRequired,
    ModelUnavailable,
    NoModel,
)
from app.observe.metrics import Metrics
from app.settings import DEFAULT_ROUTES, Settings, available_cores
from export.bundle import MANIFEST_NAME, BundleError, load_bundle_manifest

log = logging.getLogger("app.registry")

HISTORY = 20  # version events kept per model for /models


class ConfigError(RuntimeError):
    """MODELS_DIR / DEFAULT_BUNDLES / DEVICE cannot be served as configured: refuse to start."""


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


def log_failure(model: Model, version: str, error: str, path: Path) -> None:
    log.error(
        "bundle failed to load and will not be served",
        extra={
            "bundle": model.name,
            "version": version,
            "path": str(path),
            "task": model.task,
            "error": error,
            "serving": model.current.version if model.current else None,
        },
    )


class Registry:
    def __init__(self, settings: Settings, metrics: Metrics):
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, Model] = {}
        self.default_names: dict[str, str] = {}  # DEFAULT_BUNDLES, resolved to model names
        self.device: str | None = None
        self.threads = 1
        self.compute: ComputeSlots | None = None
        self.load_finished = False
        # Answers of the versions in service (RESPONSE_CACHE_MB); None when off.
        budget = int(settings.response_cache_mb * 2**20)
        self.cache = ResponseCache(budget, metrics) if budget else None

    @property
    def models_dir(self) -> Path:
        return Path(self.settings.models_dir)

    # ------------------------------------------------------------------ discovery

    def discover(self) -> None:
        if not self.models_dir.is_dir():
            raise ConfigError(f"MODELS_DIR {self.models_dir} is not a directory")
        for name, versions in scan(self.models_dir).items():
            model = self.models[name] = Model(name, required=True)
            for version in versions:  # the task of the newest readable manifest
                try:
                    manifest = load_bundle_manifest(version.path)
                    model.task, model.reranker = manifest.task, manifest.reranker
                    break
                except Exception as e:  # noqa: BLE001 - any malformed manifest fails its model only
                    model.status, model.error = "failed", f"unreadable manifest: {e}"
            if model.task is not None:
                model.status, model.error = "pending", None
            else:
                log_failure(model, versions[0].version, model.error or "", versions[0].path)
        live_control = self.settings.admin_api_key is not None or self.settings.model_poll_s > 0
        if not self.models and not live_control:
            raise ConfigError(
                f"MODELS_DIR {self.models_dir} holds no bundles (sub-directories with {MANIFEST_NAME}, "
                "or numbered version directories holding one)"
            )
        self.default_names = self._resolve_defaults(self.settings.default_bundle_map)
        try:
            self.device = resolve_device(self.settings.device, available_providers())
        except RuntimeConfigError as e:
            raise ConfigError(str(e)) from e
        cores = available_cores()
        instances = resolve_instances(self.settings.model_instances, self.device, cores)
        self.threads = session_threads(self.settings.intra_op_threads, instances, cores)
        if self.device == "cpu":
            # Every model's batches share the cores: as many at once as the cores hold sessions
            # (or an explicit MODEL_INSTANCES, which one model may then use to the full).
            self.compute = ComputeSlots(max(1, cores // self.threads, self.settings.model_instances))
        log.info(
            "models discovered",
            extra={
                "device": self.device,
                "models": {name: m.task for name, m in self.models.items()},
                "defaults": self.default_names,
            },
        )

    def _resolve_defaults(self, wanted: dict[str, str]) -> dict[str, str]:
        """DEFAULT_BUNDLES names a model directory (or, as before versions, a manifest's `name`)."""
        out = {}
        for task, name in wanted.items():
            serves = DEFAULT_ROUTES.get(task, task)  # rerank=: a classify model
            candidates = [m for m in self.models.values() if m.task == serves]
            chosen = [m for m in candidates if m.name == name] or [
                m for m in candidates if self._manifest_name(m) == name
            ]
            if not chosen:
                raise ConfigError(
                    f"DEFAULT_BUNDLES names {name!r} for {task}, but the {serves} models in MODELS_DIR "
                    f"are {[m.name for m in candidates] or 'none'}"
                )
            out[task] = chosen[0].name
        return out

    def _manifest_name(self, model: Model) -> str | None:
        for version in model_versions(self.models_dir, model.name):
            with contextlib.suppress(BundleError):
                return load_bundle_manifest(version.path).name
        return None

    def plan(self) -> SessionPlan:
        """Sessions for the next model loaded: the same for every model (so the compute slots hold),
        whichever others are loaded: an idle model takes no core from a busy one."""
        assert self.device is not None
        cores = available_cores()
        serving = sum(m.status not in ("unloaded", "failed") for m in self.models.values())
        instances = resolve_instances(self.settings.model_instances, self.device, cores)
        sessions = serving * instances
        tuning = SessionTuning(
            spinning={"on": True, "off": False}.get(self.settings.ort_spinning, sessions <= 1),
            mem_pattern=self.settings.ort_mem_pattern,
            cpu_arena=self.settings.ort_cpu_arena,
            # Shrinking applies to the arena only: without one ORT refuses the run option.
            arena_shrinkage=self.settings.ort_arena_shrinkage and self.settings.ort_cpu_arena,
            shrink_above_tokens=self.settings.ort_shrink_above_tokens,
        )
        # Several single-core sessions: a batch alone on the device may have every core.
        solo = self.threads * instances if self.settings.solo_session and self.device == "cpu" else 0
        if instances < 2 or solo > cores:
            solo = 0
        return SessionPlan(self.device, self.threads, instances, tuning, solo)

    def room(self, model: Model) -> int | None:
        """Bytes the other models leave under MAX_MODELS_MEMORY_MB (the version being replaced is
        not counted: it goes once the new one serves)."""
        if self.settings.max_models_memory_mb is None:
            return None
        used = sum(
            (m.current.memory_bytes or 0)
            for m in self.models.values()
            if m is not model and m.current is not None
        )
        return int(self.settings.max_models_memory_mb * MB) - used

    # ------------------------------------------------------------------ serving

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
    def lease(self, task: str | None, name: str | None = None) -> Iterator[Bundle]:
        """Serve one request on the version in service now, whatever swaps happen meanwhile."""
        bundle = self.serving(task, name)
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
