"""Load one version of a model: verify its files, open its sessions, warm it up, check its outputs,
and measure the memory it took. Nothing here is served until the registry swaps it in.

Resident memory is measured as the growth of this process's RSS from before the first file is
read to after the warm-up (sessions, weights, tokenizer, the arena the warm-up batches needed).
The registry runs one load at a time, so two loads never blur each other; requests served by
other models meanwhile can still move RSS a little, so the figure is approximate.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from app.engine.protocol import Item
from app.engine.reduce import Work, batch_functions
from app.engine.repository import VersionDir, manifest_digest
from app.engine.runtime import RuntimeConfigError, RuntimePool, SessionTuning, create_runtime, variant_choice
from app.engine.simulated import SimulatedRuntime
from app.engine.table import Bundle
from app.errors import MemoryLimitExceeded
from export.bundle import (
    MANIFEST_NAME,
    BundleError,
    FileInfo,
    VariantInfo,
    batch_invariant,
    load_bundle_manifest,
)
from export.invariance import batch_invariance
from processing.tasks import TASKS
from processing.tokenizer import TextTokenizer, special_tokens

MB = 1 << 20


@dataclass(frozen=True)
class SessionPlan:
    """How every model on this device opens its sessions (chosen by the registry)."""

    device: str
    threads: int
    instances: int
    tuning: SessionTuning
    solo_threads: int = 0  # a session with this many threads for batches alone in the model (0: none)
    simulated_batch_ms: float = 0.0  # DEVICE=simulated: each batch's time (app/engine/simulated.py)

    @property
    def sessions(self) -> int:
        return self.instances + (1 if self.solo_threads else 0)


def collate_for(task: str, pad_id: int) -> Callable[[list[Work]], dict[str, np.ndarray]]:
    collate, _ = batch_functions(pad_id, grouped=TASKS[task].choices)
    return collate


def resident_bytes() -> int | None:
    """This process's resident set size (Linux /proc); None where it cannot be read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def build(
    source: VersionDir,
    plan: SessionPlan,
    cpu_variant: str,
    max_batch_size: int,
    room: int | None,
    max_load_s: float = 0.0,
) -> Bundle:
    """Load `source` and check it end to end (runs in a worker thread).

    `room` is how many bytes the models may still take under MAX_MODELS_MEMORY_MB (None: no limit):
    a version whose weights alone would not fit is refused before any session opens, and one whose
    measured memory does not fit is dropped after its warm-up. `max_load_s` (MAX_LOAD_S; 0: none)
    bounds the time from the first file read to the end of the warm-up, checked after each step;
    a refused version's sessions go with it.
    """
    before = resident_bytes()
    started = time.perf_counter()

    def in_time(step: str) -> None:
        elapsed = time.perf_counter() - started
        if max_load_s and elapsed > max_load_s:
            raise BundleError(
                f"{source.model} version {source.version}: {step} after {elapsed:.1f} s, longer than "
                f"MAX_LOAD_S ({max_load_s:g} s) allows for loading and warming up"
            )

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
    # Hashes first, on the very bytes then used: a tampered, truncated or unlisted file never
    # reaches onnxruntime or the tokenizer (read_verified).
    variant = manifest.variants[bundle.variant]
    model_bytes = read_verified(source.path, variant.file, variant)
    tokenizer_files = {
        name: read_verified(source.path, name, info) for name, info in manifest.tokenizer_files.items()
    }
    bundle.tokenizer = tokenizer_from_verified(tokenizer_files, manifest.do_lower_case)
    bundle.threads = plan.threads
    path = manifest.variant_path(source.path, bundle.variant)
    if plan.device == "simulated":
        vocab = bundle.tokenizer.vocab_size
        simulated = SimulatedRuntime(manifest, plan.simulated_batch_ms, max_batch_size, vocab=vocab)
        bundle.runtime = RuntimePool([simulated])
    else:
        with tempfile.TemporaryDirectory(prefix="no-external-data-") as empty:
            opened = functools.partial(
                open_session,
                path,
                plan.device,
                disabled=variant.disabled_optimizers,
                data=model_bytes,
                empty=empty,
                variant=bundle.variant,
            )
            solo = None
            if plan.solo_threads:
                solo = opened(plan.solo_threads, plan.tuning.solo())
            sessions = [opened(plan.threads, plan.tuning) for _ in range(plan.instances)]
            bundle.runtime = RuntimePool(sessions, solo)
    del model_bytes, tokenizer_files
    in_time("its sessions were open")
    warm_up(bundle, max_batch_size, in_time)
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


def read_verified(bundle_dir: Path, name: str, expected: FileInfo | VariantInfo) -> bytes:
    """A file the manifest lists, read once and checked against its size and sha256."""
    path = bundle_dir / name
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BundleError(f"{name} is missing or unreadable (listed in {MANIFEST_NAME})") from e
    if len(data) != expected.bytes:
        raise BundleError(
            f"{name} is {len(data)} bytes but {MANIFEST_NAME} says {expected.bytes}: truncated or replaced"
        )
    if hashlib.sha256(data).hexdigest() != expected.sha256:
        raise BundleError(f"{name} does not match its sha256 in {MANIFEST_NAME}: modified or corrupted")
    return data


def tokenizer_from_verified(files: dict[str, bytes], do_lower_case: bool) -> TextTokenizer:
    """The tokenizer from the listed, verified files only (never another file of the directory):
    tokenizer.json if listed, else vocab.txt; casing from a listed tokenizer_config.json, else the
    manifest's do_lower_case."""
    lower, specials = do_lower_case, {}
    try:
        if "tokenizer_config.json" in files:
            config = json.loads(files["tokenizer_config.json"])
            if isinstance(config, dict):
                lower, specials = bool(config.get("do_lower_case", True)), special_tokens(config)
        if "tokenizer.json" in files:
            tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
            return TextTokenizer(tokenizer, lower, specials)
        if "vocab.txt" in files:
            tokens = files["vocab.txt"].decode("utf-8").splitlines()
            vocab = {token: i for i, token in enumerate(tokens)}
            return TextTokenizer(BertWordPieceTokenizer(vocab, lowercase=lower)._tokenizer, lower)
    except Exception as e:  # tokenizers raises plain Exceptions; a bad file is the bundle's fault
        raise BundleError(f"the tokenizer files listed in {MANIFEST_NAME} do not load: {str(e)[:200]}") from e
    raise BundleError(f"{MANIFEST_NAME} lists neither tokenizer.json nor vocab.txt")


def open_session(
    path: Path,
    device: str,
    threads: int,
    tuning: SessionTuning,
    *,
    disabled: list[str],
    data: bytes,
    empty: str,
    variant: str | None = None,
) -> Any:
    """One session from the verified bytes; external data is looked for only in the empty `empty`."""
    try:
        return create_runtime(
            path,
            device,
            threads,
            tuning,
            disabled_optimizers=disabled,
            model_bytes=data,
            external_data_dir=empty,
            variant=variant,
        )
    except RuntimeConfigError:
        raise
    except Exception as e:  # onnxruntime's own errors: the message, without this machine's paths
        text = str(e).replace(empty, "<none>").replace(str(path.parent), "<bundle>")
        if "external data" in text.lower():
            raise BundleError(
                f"{path.name} keeps weights in external data files, which are not listed with their sha256 "
                "in the manifest and are never read: export the model as one file"
            ) from e
        raise BundleError(f"onnxruntime cannot load {path.name}: {text[:300]}") from e


def warm_up(bundle: Bundle, max_batch_size: int, in_time: Callable[[str], None] = lambda step: None) -> None:
    """Run a short and a full-length batch, and check the outputs against the manifest;
    `in_time(step)` after each raises once the load has taken too long."""
    manifest, tokenizer, runtime = bundle.manifest, bundle.tokenizer, bundle.runtime
    assert tokenizer is not None and runtime is not None
    short = tokenizer.encode("warm up", max_length=manifest.max_seq_len)
    longest = tokenizer.encode("warm up " * manifest.max_seq_len, max_length=manifest.max_seq_len)
    collate = collate_for(manifest.task, tokenizer.pad_id)
    spec = TASKS[manifest.task]
    rows = min(4, max_batch_size)
    for batch in ([short], [longest] * rows):
        payloads = [Work(Item.of([e, e] if spec.choices else [e])) for e in batch]
        outputs = runtime.run(collate(payloads))
        runtime.run_alone(collate(payloads))  # the solo session's first run, if it has one
        in_time(f"its warm-up batch of {len(batch)} row(s) was done")
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
        pair = [Work(Item.of([e, e] if spec.choices else [e])) for e in (short, longest)]
        report = batch_invariance(manifest.task, runtime.run, [collate(pair)], runtime.run_alone)
        if not report["invariant"]:
            raise BundleError(
                f"variant {bundle.variant} should give a row the same outputs alone and in a batch, "
                f"but they differ by {report['max_abs_diff']:.3g} on this machine; set CPU_VARIANT=fused"
            )
