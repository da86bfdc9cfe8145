"""The models being served: discovery, each task's default, verified loading, atomic version swaps,
unloading, and watching MODELS_DIR.

A request leases the version that serves its model when it is admitted and keeps it until it is
answered. A new version is built and checked aside (app/loader.py) and then swapped in with one
assignment on the event loop, so requests already admitted finish on the old version, which is
retired once its last request is answered. A version that fails its checks is recorded and
logged, and never replaces the one serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from export.bundle import MANIFEST_NAME, BundleError, load_bundle_manifest

from .batcher import Batcher
from .loader import MB, Bundle, SessionPlan, build, collate_for
from .metrics import Metrics
from .model_errors import (
    MemoryLimitExceeded,
    ModelLoading,
    ModelRequired,
    ModelUnavailable,
    NoModel,
    VersionRejected,
)
from .repository import VersionDir, check_model_name, fingerprint, model_versions, scan
from .runtime import (
    RuntimeConfigError,
    SessionTuning,
    available_providers,
    resolve_batch_tokens,
    resolve_device,
    resolve_instances,
    resolve_padding_factor,
    session_threads,
)
from .settings import Settings, available_cores

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
    history: list[VersionEvent] = field(default_factory=list)
    seen: tuple = ()  # the repository fingerprint of the last load attempt (for the poller)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def event(self, version: VersionDir | Bundle, status: str, error: str | None = None) -> None:
        path = str(version.path)
        for record in self.history:
            if (
                record.version == version.version
                and record.path == path
                and record.status
                in (
                    "loading",
                    "serving",
                    "retiring",
                )
            ):
                record.status, record.error, record.at = status, error, utc_now()
                return
        digest = version.digest if isinstance(version, Bundle) else None
        self.history.insert(0, VersionEvent(version.version, path, status, digest, error))
        del self.history[HISTORY:]


class Registry:
    def __init__(
        self, settings: Settings, metrics: Metrics, service_factory: Callable[[Bundle, Settings], Any]
    ):
        self.settings = settings
        self.metrics = metrics
        self.service_factory = service_factory
        self.models: dict[str, Model] = {}
        self.default_names: dict[str, str] = {}  # DEFAULT_BUNDLES, resolved to model names
        self.device: str | None = None
        self.threads = 1
        self.compute: asyncio.Semaphore | None = None
        self.load_finished = False
        self._load_lock = asyncio.Lock()  # one load at a time: CPU, and a clean memory measure
        self._retiring: set[asyncio.Task] = set()

    @property
    def models_dir(self) -> Path:
        return Path(self.settings.models_dir)

    # ------------------------------------------------------------------ discovery

    def discover(self) -> None:
        if not self.models_dir.is_dir():
            raise ConfigError(f"MODELS_DIR {self.models_dir} is not a directory")
        for name, versions in scan(self.models_dir).items():
            model = self.models[name] = Model(name)
            for version in versions:  # the task of the newest readable manifest
                try:
                    model.task = load_bundle_manifest(version.path).task
                    break
                except BundleError as e:
                    model.status, model.error = "failed", f"unreadable manifest: {e}"
            if model.task is not None:
                model.status, model.error = "pending", None
            else:
                self._log_failure(model, versions[0].version, model.error or "")
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
        served = sum(m.task is not None for m in self.models.values())
        instances = resolve_instances(self.settings.model_instances, self.device, served, cores)
        self.threads = session_threads(self.settings.intra_op_threads, max(1, served) * instances, cores)
        if self.device == "cpu":
            # Every model's batches share the cores: as many at once as the cores hold sessions.
            self.compute = asyncio.Semaphore(max(1, cores // self.threads))
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
            candidates = [m for m in self.models.values() if m.task == task]
            chosen = [m for m in candidates if m.name == name] or [
                m for m in candidates if self._manifest_name(m) == name
            ]
            if not chosen:
                raise ConfigError(
                    f"DEFAULT_BUNDLES names {name!r} for {task}, but the {task} models in MODELS_DIR "
                    f"are {[m.name for m in candidates] or 'none'}"
                )
            out[task] = chosen[0].name
        return out

    def _manifest_name(self, model: Model) -> str | None:
        for version in model_versions(self.models_dir, model.name):
            with contextlib.suppress(BundleError):
                return load_bundle_manifest(version.path).name
        return None

    def _plan(self) -> SessionPlan:
        assert self.device is not None
        cores = available_cores()
        serving = sum(m.status not in ("unloaded", "failed") for m in self.models.values())
        instances = resolve_instances(self.settings.model_instances, self.device, max(1, serving), cores)
        sessions = serving * instances
        tuning = SessionTuning(
            spinning={"on": True, "off": False}.get(self.settings.ort_spinning, sessions <= 1),
            mem_pattern=self.settings.ort_mem_pattern,
            cpu_arena=self.settings.ort_cpu_arena,
            # Shrinking applies to the arena only: without one ORT refuses the run option.
            arena_shrinkage=self.settings.ort_arena_shrinkage and self.settings.ort_cpu_arena,
            shrink_above_tokens=self.settings.ort_shrink_above_tokens,
        )
        return SessionPlan(self.device, self.threads, instances, tuning)

    # ------------------------------------------------------------------ loading

    async def run(self) -> None:
        """Load every discovered model, then (MODEL_POLL_S) keep applying MODELS_DIR's changes."""
        for model in list(self.models.values()):
            if model.task is not None:
                with contextlib.suppress(VersionRejected, NoModel):
                    await self._load(model, fall_back=True)
        self.load_finished = True
        interval = self.settings.model_poll_s
        while interval > 0:
            await asyncio.sleep(interval)
            try:
                await self.poll()
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad poll
                log.exception("polling MODELS_DIR failed")

    async def load(self, name: str) -> tuple[Model, bool]:
        """Load the newest version of `name` from MODELS_DIR, or reload it if it changed.

        Returns the model and whether a new version went into service. Raises NoModel when
        MODELS_DIR has no such model, VersionRejected (MemoryLimitExceeded) when the version failed
        its checks; the version serving before, if any, then still serves.
        """
        check_model_name(name)
        model = self.models.get(name)
        if model is None:
            if not model_versions(self.models_dir, name):
                on_disk = ", ".join(scan(self.models_dir)) or "none"
                raise NoModel(
                    f"MODELS_DIR has no model {name!r} (no {name}/{MANIFEST_NAME} nor "
                    f"{name}/<version>/{MANIFEST_NAME}); it has: {on_disk}"
                )
            model = self.models.setdefault(name, Model(name))
        return model, await self._load(model, fall_back=model.current is None)

    async def _load(self, model: Model, fall_back: bool) -> bool:
        async with model.lock:
            versions = model_versions(self.models_dir, model.name)
            model.seen = fingerprint(versions)
            if not versions:
                raise NoModel(f"MODELS_DIR has no version of {model.name!r} any more")
            current, newest = model.current, versions[0]
            if current is not None and (current.version, current.path, current.signature) == (
                newest.version,
                newest.path,
                newest.signature,
            ):
                return False  # already serving exactly these files
            if current is None:
                model.status, model.error = "loading", None
            # Without a version in service, an older version may serve when the newest fails; with
            # one, a newest version that fails never gives way to anything but the one serving.
            candidates = versions if fall_back and current is None else versions[:1]
            failure: VersionRejected | None = None
            for candidate in candidates:
                try:
                    await self._put_in_service(model, candidate)
                    return True
                except VersionRejected as e:
                    failure = e
            assert failure is not None
            if model.current is None:
                model.status, model.error = "failed", failure.message
            failure.serving = model.current.version if model.current else None
            raise failure

    async def _put_in_service(self, model: Model, source: VersionDir) -> None:
        model.event(source, "loading")
        async with self._load_lock:
            try:
                bundle = await asyncio.to_thread(
                    build,
                    source,
                    self._plan(),
                    self.settings.cpu_variant,
                    self.settings.max_batch_size,
                    self._room(model),
                )
                if model.task is not None and bundle.task != model.task:
                    raise BundleError(
                        f"version {source.version} is a {bundle.task} model, but {model.name!r} serves "
                        f"{model.task}: a model keeps its task (give the new one another name)"
                    )
                self._start(bundle)
            except Exception as e:  # noqa: BLE001 - whatever broke, this version is not served
                message = e.message if isinstance(e, VersionRejected) else f"version {source.version}: {e}"
                model.event(source, "rejected", message)
                self._log_failure(model, source.version, message, source.path)
                self.metrics.model_loads.labels(model=model.name, result="rejected").inc()
                kind = MemoryLimitExceeded if isinstance(e, MemoryLimitExceeded) else VersionRejected
                raise kind(message, serving=None) from e
        old, model.current = model.current, bundle  # the swap: new requests lease the new version
        model.task, model.status, model.error = bundle.task, "ready", None
        model.event(bundle, "serving")
        self.metrics.model_ready.labels(task=bundle.task, model=model.name).set(1)
        self.metrics.model_memory.labels(model=model.name).set(bundle.memory_bytes or 0)
        self.metrics.model_loads.labels(model=model.name, result="loaded").inc()
        log.info(
            "bundle ready",
            extra={
                "model": model.name,
                "version": bundle.version,
                "replaced": old.version if old else None,
                "task": bundle.task,
                "variant": bundle.variant,
                "provider": bundle.runtime.provider if bundle.runtime else None,
                "threads": bundle.threads,
                "instances": bundle.runtime.instances if bundle.runtime else None,
                "memory_mb": round((bundle.memory_bytes or 0) / MB, 1),
                "load_seconds": bundle.load_seconds,
            },
        )
        if old is not None:
            model.event(old, "retiring")
            task = asyncio.create_task(self._retire(model, old), name=f"retire-{model.name}-{old.version}")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def _room(self, model: Model) -> int | None:
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

    def _start(self, bundle: Bundle) -> None:
        assert bundle.runtime is not None and bundle.tokenizer is not None and self.device is not None
        bundle.batcher = Batcher(
            bundle.runtime,
            collate_for(bundle.task, bundle.tokenizer.pad_id),
            max_batch_size=self.settings.max_batch_size,
            max_batch_tokens=resolve_batch_tokens(self.settings.max_batch_tokens, self.device),
            max_wait_ms=self.settings.max_wait_ms,
            max_queue=self.settings.max_queue,
            max_padding_factor=resolve_padding_factor(self.settings.max_padding_factor, self.device),
            observer=self.metrics.observer(bundle.task, bundle.name),
            name=f"{bundle.name}-{bundle.version}",
            concurrency=bundle.runtime.instances,
            inline_tokens=self.settings.inline_batch_tokens if self.device == "cpu" else 0,
            compute=self.compute,
        )
        bundle.service = self.service_factory(bundle, self.settings)
        bundle.batcher.start()

    def _log_failure(self, model: Model, version: str, error: str, path: Path | None = None) -> None:
        log.error(
            "bundle failed to load and will not be served",
            extra={
                "bundle": model.name,
                "version": version,
                "path": str(path or self.models_dir / model.name),
                "task": model.task,
                "error": error,
                "serving": model.current.version if model.current else None,
            },
        )

    # ------------------------------------------------------------------ retiring, unloading

    async def _retire(self, model: Model, bundle: Bundle) -> float:
        """Wait for the requests `bundle` is serving (up to SHUTDOWN_GRACE_S), then close it."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        if bundle.leases > 0:
            bundle.idle = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(bundle.idle.wait(), self.settings.shutdown_grace_s)
            if bundle.leases > 0:
                log.warning(
                    "retiring a version with requests still in flight after SHUTDOWN_GRACE_S",
                    extra={"model": bundle.name, "version": bundle.version, "in_flight": bundle.leases},
                )
        if bundle.batcher is not None:
            await bundle.batcher.stop(drain=True)
        bundle.runtime = bundle.service = None  # the sessions go with the last reference
        model.event(bundle, "retired")
        log.info("model version retired", extra={"model": bundle.name, "version": bundle.version})
        return loop.time() - started

    async def unload(self, name: str) -> tuple[Model, float]:
        """Stop serving `name`: new requests are refused at once, those in flight finish first."""
        model = self.models.get(check_model_name(name))
        if model is None or model.status == "unloaded":
            raise NoModel(f"model {name!r} is not loaded; loaded: {', '.join(self._names()) or 'none'}")
        async with model.lock:
            bundle, model.current = model.current, None
            model.status, model.error = "unloading", None
            waited = await self._retire(model, bundle) if bundle is not None else 0.0
            model.status, model.error = (
                "unloaded",
                "unloaded through the admin API or removed from MODELS_DIR",
            )
            if model.task is not None:
                self.metrics.forget_model(model.task, model.name)
        log.info("model unloaded", extra={"model": name, "waited_s": round(waited, 3)})
        return model, waited

    async def poll(self) -> dict[str, list[str]]:
        """Apply MODELS_DIR's changes: load new models and changed versions, unload removed models."""
        on_disk = scan(self.models_dir)
        done: dict[str, list[str]] = {"loaded": [], "rejected": [], "unloaded": []}
        for name, versions in on_disk.items():
            model = self.models.get(name)
            if model is not None and model.seen == fingerprint(versions):
                continue
            try:
                if (await self.load(name))[1]:
                    done["loaded"].append(name)
            except VersionRejected:
                done["rejected"].append(name)
        for name, model in list(self.models.items()):
            if name not in on_disk and model.status != "unloaded":
                await self.unload(name)
                done["unloaded"].append(name)
        return done

    # ------------------------------------------------------------------ serving

    def _names(self, task: str | None = None) -> list[str]:
        return [
            n for n, m in self.models.items() if m.status != "unloaded" and (task is None or m.task == task)
        ]

    def default_name(self, task: str) -> str | None:
        """DEFAULT_BUNDLES' choice for the task, else its only model."""
        if task in self.default_names:
            return self.default_names[task]
        names = self._names(task)
        return names[0] if len(names) == 1 else None

    def resolve(self, task: str, name: str | None) -> Model:
        if name is None:
            name = self.default_name(task)
            if name is None:
                choices = self._names(task)
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
        if model.task != task:
            raise NoModel(
                f"model {name!r} serves {model.task}, not {task}; {task} models: "
                f"{', '.join(self._names(task)) or 'none'}"
            )
        return model

    def _listing(self) -> str:
        return ", ".join(f"{n} ({self.models[n].task})" for n in self._names()) or "none"

    def serving(self, task: str, name: str | None = None) -> Bundle:
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
    def lease(self, task: str, name: str | None = None) -> Iterator[Bundle]:
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
        models = [m for m in self.models.values() if m.status != "unloaded"]
        statuses = {m.name: m.status for m in models}
        errors = {m.name: m.error for m in models if m.status == "failed" and m.error}
        if any(m.status == "failed" for m in models):
            return False, "failed", statuses, errors
        if not self.load_finished or any(m.current is None for m in models):
            return False, "loading", statuses, errors
        return True, "ready", statuses, errors

    async def close(self) -> None:
        for model in self.models.values():
            if model.current is not None and model.current.batcher is not None:
                await model.current.batcher.stop(drain=True)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
