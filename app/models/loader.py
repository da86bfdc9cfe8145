"""Load one version of a model: verify its files, open its sessions, warm it up, check its outputs,
and measure the memory it took. Nothing here is served until the registry swaps it in.

Resident memory is measured as the growth of this process's RSS from before the first file is
read to after the warm-up (sessions, weights, tokenizer, the arena the warm-up batches needed).
The registry runs one load at a time, so two loads never blur each other; requests served by
other models meanwhile can still move RSS a little, so the figure is approximate.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.backend.runtime import RuntimePool, SessionTuning, create_runtime, variant_choice
from app.core.batcher import Batcher
from app.errors import MemoryLimitExceeded
from app.models.repository import VersionDir, manifest_digest
from export.bundle import (
    MANIFEST_NAME,
    BundleError,
    BundleManifest,
    batch_invariant,
    load_bundle_manifest,
    verify_bundle_files,
)
from export.invariance import batch_invariance
from processing.padding import pad_batch, pad_choices
from processing.tasks import TASKS
from processing.tokenizer import TextTokenizer

if TYPE_CHECKING:
    from app.core.task_service import TaskService

MB = 1 << 20


@dataclass(frozen=True)
class SessionPlan:
    """How every model on this device opens its sessions (chosen by the registry)."""

    device: str
    threads: int
    instances: int
    tuning: SessionTuning
    solo_threads: int = 0  # a session with this many threads for batches alone in the model (0: none)

    @property
    def sessions(self) -> int:
        return self.instances + (1 if self.solo_threads else 0)


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
    variant_reason: str | None = None  # why this variant (app.backend.runtime.variant_choice)
    device: str | None = None
    threads: int | None = None
    tokenizer: TextTokenizer | None = None
    runtime: RuntimePool | None = None
    batcher: Batcher | None = None
    service: TaskService | None = None  # app/core/services.py, made by app/models/control.py
    load_seconds: float | None = None
    memory_bytes: int | None = None
    leases: int = 0  # requests being served by this version right now
    idle: asyncio.Event | None = None  # set when a retiring version's last request finishes

    @property
    def task(self) -> str:
        return self.manifest.task


def collate_for(task: str, pad_id: int) -> Callable[[list[Any]], dict[str, np.ndarray]]:
    if TASKS[task].choices:
        return lambda groups: pad_choices(groups, pad_id)
    return lambda encodings: pad_batch(encodings, pad_id)


def resident_bytes() -> int | None:
    """This process's resident set size (Linux /proc); None where it cannot be read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def build(
    source: VersionDir, plan: SessionPlan, cpu_variant: str, max_batch_size: int, room: int | None
) -> Bundle:
    """Load `source` and check it end to end (runs in a worker thread).

    `room` is how many bytes the models may still take under MAX_MODELS_MEMORY_MB (None: no limit):
    a version whose weights alone would not fit is refused before any session opens, and one whose
    measured memory does not fit is dropped after its warm-up.
    """
    before = resident_bytes()
    started = time.perf_counter()
    manifest = load_bundle_manifest(source.path)
    bundle = Bundle(
        source.model, source.version, source.path, manifest, manifest_digest(source.path), source.signature
    )
    bundle.device = plan.device
    bundle.variant, bundle.variant_reason = variant_choice(plan.device, manifest.variants, cpu_variant)
    weights = manifest.variants[bundle.variant].bytes * plan.sessions
    if room is not None and weights > room:
        raise MemoryLimitExceeded(
            f"{source.model} version {source.version}: its {plan.sessions} session(s) of "
            f"{manifest.variants[bundle.variant].file} hold at least {weights / MB:.1f} MB of weights, "
            f"and MAX_MODELS_MEMORY_MB leaves {room / MB:.1f} MB",
            serving=None,
        )
    # Hashes first: a tampered or truncated file must never reach onnxruntime.
    verify_bundle_files(source.path, manifest, bundle.variant)
    bundle.tokenizer = TextTokenizer.from_dir(source.path)
    bundle.threads = plan.threads
    path = manifest.variant_path(source.path, bundle.variant)
    disabled = manifest.variants[bundle.variant].disabled_optimizers
    solo = None
    if plan.solo_threads:
        # Spins while it runs (a lone request gets the whole machine's latency), never after.
        tuning = replace(plan.tuning, spinning=True, stop_spinning_after_run=True)
        solo = create_runtime(
            path, plan.device, plan.solo_threads, tuning, disabled_optimizers=disabled, variant=bundle.variant
        )
    bundle.runtime = RuntimePool(
        [
            create_runtime(
                path,
                plan.device,
                plan.threads,
                plan.tuning,
                disabled_optimizers=disabled,
                variant=bundle.variant,
            )
            for _ in range(plan.instances)
        ],
        solo,
    )
    warm_up(bundle, max_batch_size)
    after = resident_bytes()
    if before is not None and after is not None:
        bundle.memory_bytes = max(0, after - before)
        if room is not None and bundle.memory_bytes > room:
            raise MemoryLimitExceeded(
                f"{source.model} version {source.version} took {bundle.memory_bytes / MB:.1f} MB once "
                f"loaded and warmed up, and MAX_MODELS_MEMORY_MB leaves {room / MB:.1f} MB",
                serving=None,
            )
    bundle.load_seconds = round(time.perf_counter() - started, 3)
    return bundle


def warm_up(bundle: Bundle, max_batch_size: int) -> None:
    """Run a short and a full-length batch, and check the outputs against the manifest."""
    manifest, tokenizer, runtime = bundle.manifest, bundle.tokenizer, bundle.runtime
    assert tokenizer is not None and runtime is not None
    short = tokenizer.encode("warm up", max_length=manifest.max_seq_len)
    longest = tokenizer.encode("warm up " * manifest.max_seq_len, max_length=manifest.max_seq_len)
    collate = collate_for(manifest.task, tokenizer.pad_id)
    spec = TASKS[manifest.task]
    rows = min(4, max_batch_size)
    for batch in ([short], [longest] * rows):
        payloads: list[Any] = [[e, e] for e in batch] if spec.choices else batch
        outputs = runtime.run(collate(payloads))
        runtime.run_alone(collate(payloads))  # the solo session's first run, if it has one
        missing = set(manifest.output_names) - set(outputs)
        if missing:
            raise BundleError(f"model outputs lack {sorted(missing)} listed in {MANIFEST_NAME}")
        if spec.labelled and manifest.problem_type != "regression":
            n_labels = outputs["logits"].shape[-1]
            if n_labels != len(manifest.labels or []):
                raise BundleError(
                    f"model emits {n_labels} labels but {MANIFEST_NAME} lists {len(manifest.labels or [])}"
                )
        if not all(np.isfinite(v).all() for v in outputs.values()):
            raise BundleError("warm-up produced NaN or infinite outputs")
    if bundle.variant and batch_invariant(bundle.variant, bundle.device):
        # The promise /models makes, checked on this machine's kernels: the short input alone (on
        # the session a lone request gets) against the same input padded next to the longest one.
        pair: list[Any] = [short, longest]
        if spec.choices:
            pair = [[e, e] for e in pair]
        report = batch_invariance(manifest.task, runtime.run, [collate(pair)], runtime.run_alone)
        if not report["invariant"]:
            raise BundleError(
                f"variant {bundle.variant} should give a row the same outputs alone and in a batch, "
                f"but they differ by {report['max_abs_diff']:.3g} on this machine; set CPU_VARIANT=fused"
            )
