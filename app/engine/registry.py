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

import contextlib
import logging
from pathlib import Path

from app.engine.batch_types import ComputeSlots
from app.engine.loader import MB, SessionPlan
from app.engine.repository import model_versions, scan
from app.engine.runtime import (
    RuntimeConfigError,
    SessionTuning,
    available_providers,
    resolve_device,
    resolve_instances,
    session_threads,
)
from app.engine.table import Model, ModelTable
from app.observe.metrics import Metrics
from app.settings import DEFAULT_ROUTES, Settings, available_cores
from export.bundle import MANIFEST_NAME, BundleError, load_bundle_manifest

log = logging.getLogger("app.registry")


def session_tuning(settings: Settings, sessions: int) -> SessionTuning:
    """The ORT_* settings as every model session's tuning, `sessions` of them sharing the cores (the
    solo session adds `.solo()`); benchmarks.model_only opens its reference sessions with it too."""
    return SessionTuning(
        spinning={"on": True, "off": False}.get(settings.ort_spinning, sessions <= 1),
        mem_pattern=settings.ort_mem_pattern,
        cpu_arena=settings.ort_cpu_arena,
        # Shrinking applies to the arena only: without one ORT refuses the run option.
        arena_shrinkage=settings.ort_arena_shrinkage and settings.ort_cpu_arena,
        shrink_above_tokens=settings.ort_shrink_above_tokens,
    )


class ConfigError(RuntimeError):
    """MODELS_DIR / DEFAULT_BUNDLES / DEVICE cannot be served as configured: refuse to start."""


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


class Registry(ModelTable):
    """The engine's model table: discovery and the device plan besides (app/engine/table.py)."""

    def __init__(self, settings: Settings, metrics: Metrics):
        super().__init__(settings)
        self.metrics = metrics
        self.threads = 1
        self.compute: ComputeSlots | None = None

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
        tuning = session_tuning(self.settings, sessions)
        # Several single-core sessions: a batch alone on the device may have every core.
        solo = self.threads * instances if self.settings.solo_session and self.device == "cpu" else 0
        if instances < 2 or solo > cores:
            solo = 0
        return SessionPlan(
            self.device,
            self.threads,
            instances,
            tuning,
            solo,
            simulated_batch_ms=self.settings.simulated_batch_ms,
        )

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
