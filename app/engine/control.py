"""Live model control: load a model's newest verified version, swap it in atomically, retire or
unload versions once their requests are answered, and follow MODELS_DIR (MODEL_POLL_S).

A new version is built and checked aside (app/engine/loader.py: hashes, sessions, warm-up, output check,
memory) and swapped in with one assignment on the event loop. Requests already admitted hold a
lease on the version they started on (Registry.lease) and finish there; the old version is closed
once its last lease is returned. A version that fails its checks is recorded in /models and logged,
and never replaces the one serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from app.engine.batcher import Batcher
from app.engine.client import Engine
from app.engine.heap import settle_heap
from app.engine.loader import MB, Bundle, build
from app.engine.reduce import batch_functions
from app.engine.registry import Model, Registry, log_failure
from app.engine.repository import VersionDir, check_model_name, fingerprint, model_versions, scan
from app.engine.runtime import resolve_batch_tokens, resolve_padding_factor
from app.errors import MemoryLimitExceeded, NoModel, VersionRejected
from export.bundle import MANIFEST_NAME, BundleError
from processing.tasks import TASKS

log = logging.getLogger("app.control")


class ModelControl:
    def __init__(
        self,
        registry: Registry,
        engine: Engine,
        make_service: Callable[[Bundle], Any] | None = None,
        on_retired: Callable[[str, str], None] | None = None,
        before_retire: Callable[[], Awaitable[None]] | None = None,
        lone_request: Callable[[], bool] | None = None,
    ):
        """`make_service` builds a version's front-end service when it loads (the entry module wires
        it; the engine knows nothing of the front end); `on_retired(model, version)` is the event a
        retired version sends, on which the front end forgets its answers (the response cache)."""
        self.registry = registry
        self.engine = engine
        self.lone_request = lone_request  # the process serves one request now (Batcher's inline rule)
        self.make_service = make_service
        self.on_retired = on_retired
        # In the engine process: publish the table without the version, and wait until every front
        # end has applied it (app/engine/process.py), before the version's batcher stops.
        self.before_retire = before_retire
        self.settings, self.metrics = registry.settings, registry.metrics
        self._load_lock = asyncio.Lock()  # one load at a time: CPU, and a clean memory measure
        self._retiring: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ loading

    async def run(self) -> None:
        """Load every discovered model, then (MODEL_POLL_S) keep applying MODELS_DIR's changes."""
        for model in list(self.registry.models.values()):
            if model.task is not None:
                with contextlib.suppress(VersionRejected, NoModel):
                    await self._load(model, fall_back=True)
        self.registry.load_finished = True
        settle_heap()
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
        model = self.registry.models.get(name)
        if model is None:
            if not model_versions(self.registry.models_dir, name):
                on_disk = ", ".join(scan(self.registry.models_dir)) or "none"
                raise NoModel(
                    f"MODELS_DIR has no model {name!r} (no {name}/{MANIFEST_NAME} nor "
                    f"{name}/<version>/{MANIFEST_NAME}); it has: {on_disk}"
                )
            model = self.registry.models.setdefault(name, Model(name))
        return model, await self._load(model, fall_back=model.current is None)

    async def _load(self, model: Model, fall_back: bool) -> bool:
        async with model.lock:
            versions = model_versions(self.registry.models_dir, model.name)
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
                    self.registry.plan(),
                    self.settings.cpu_variant,
                    self.settings.max_batch_size,
                    self.registry.room(model),
                    self.settings.max_load_s,
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
                log_failure(model, source.version, message, source.path)
                self.metrics.model_loads.labels(model=model.name, result="rejected").inc()
                kind = MemoryLimitExceeded if isinstance(e, MemoryLimitExceeded) else VersionRejected
                raise kind(message, serving=None) from e
        old, model.current = model.current, bundle  # the swap: new requests lease the new version
        model.task, model.status, model.error, model.required = bundle.task, "ready", None, True
        model.reranker = bundle.manifest.reranker
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
                "variant_reason": bundle.variant_reason,
                "provider": bundle.runtime.provider if bundle.runtime else None,
                "threads": bundle.threads,
                "instances": bundle.runtime.instances if bundle.runtime else None,
                "memory_mb": round((bundle.memory_bytes or 0) / MB, 1),
                "load_seconds": bundle.load_seconds,
            },
        )
        if old is not None:
            self._forget_answers(old)  # new requests lease the new version from here on
            model.event(old, "retiring")
            task = asyncio.create_task(self._retire(model, old), name=f"retire-{model.name}-{old.version}")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def _start(self, bundle: Bundle) -> None:
        """The version's batcher (sharing the device's compute slots) and its task service."""
        device, settings = self.registry.device, self.settings
        assert bundle.runtime is not None and bundle.tokenizer is not None and device is not None
        collate, split = batch_functions(bundle.tokenizer.pad_id, grouped=TASKS[bundle.task].choices)
        bundle.batcher = Batcher(
            bundle.runtime,
            collate,
            split=split,
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=resolve_batch_tokens(settings.max_batch_tokens, device),
            max_wait_ms=settings.max_wait_ms,
            max_queue=settings.max_queue,
            max_padding_factor=resolve_padding_factor(settings.max_padding_factor, device),
            observer=self.metrics.observer(bundle.task, bundle.name),
            name=f"{bundle.name}-{bundle.version}",
            concurrency=bundle.runtime.instances,
            inline_tokens=settings.inline_batch_tokens if device == "cpu" else 0,
            lone_request=self.lone_request,
            compute=self.registry.compute,
            aging_ms=settings.priority_aging_ms,
        )
        bundle.service = self.make_service(bundle) if self.make_service is not None else None
        bundle.batcher.start()
        self.engine.add(bundle.name, bundle.version, bundle.batcher)

    # ------------------------------------------------------------------ retiring, unloading

    async def _retire(self, model: Model, bundle: Bundle) -> float:
        """Wait for the requests `bundle` is serving (up to SHUTDOWN_GRACE_S), then close it."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self.before_retire is not None:
            await self.before_retire()
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
        self.engine.remove(bundle.name, bundle.version)
        bundle.runtime = bundle.service = None  # the sessions go with the last reference
        self._forget_answers(bundle)  # an unloaded model's version is dropped here
        model.event(bundle, "retired")
        log.info("model version retired", extra={"model": bundle.name, "version": bundle.version})
        return loop.time() - started

    def _forget_answers(self, bundle: Bundle) -> None:
        if self.on_retired is not None:
            self.on_retired(bundle.name, bundle.version)

    async def unload(self, name: str) -> tuple[Model, float]:
        """Stop serving `name`: new requests are refused at once, those in flight finish first."""
        model = self.registry.models.get(check_model_name(name))
        if model is None or model.status == "unloaded":
            raise NoModel(
                f"model {name!r} is not loaded; loaded: {', '.join(self.registry.names()) or 'none'}"
            )
        async with model.lock:
            bundle, model.current = model.current, None
            model.status, model.error = "unloading", None
            waited = await self._retire(model, bundle) if bundle is not None else 0.0
            model.status, model.error = "unloaded", "unloaded by the admin API or removed from MODELS_DIR"
            model.required = False
            if model.task is not None:
                self.metrics.forget_model(model.task, model.name)
        log.info("model unloaded", extra={"model": name, "waited_s": round(waited, 3)})
        return model, waited

    async def poll(self) -> dict[str, list[str]]:
        """Apply MODELS_DIR's changes: load new models and changed versions, unload removed models."""
        on_disk = scan(self.registry.models_dir)
        done: dict[str, list[str]] = {"loaded": [], "rejected": [], "unloaded": []}
        for name, versions in on_disk.items():
            model = self.registry.models.get(name)
            if model is not None and model.seen == fingerprint(versions):
                continue
            try:
                if (await self.load(name))[1]:
                    done["loaded"].append(name)
            except VersionRejected:
                done["rejected"].append(name)
        for name, model in list(self.registry.models.items()):
            if name not in on_disk and model.status != "unloaded":
                await self.unload(name)
                done["unloaded"].append(name)
        return done

    async def close(self) -> None:
        """Drain every serving version, and wait for those retiring."""
        for model in self.registry.models.values():
            if model.current is not None and model.current.batcher is not None:
                await model.current.batcher.stop(drain=True)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
