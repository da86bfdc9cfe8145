"""ONNX Runtime sessions: device and variant selection, thread budget, IO binding on CUDA.

The selection functions are pure so they can be tested without a GPU; `create_runtime`
takes the session factory as a parameter for the same reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from export.int8_precision import cpu_int8_variant, exact_int8

log = logging.getLogger("app.runtime")

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
CPU_VARIANT_ORDER = ("int8-rowwise", "int8-rowwise-avx2", "int8", "fused", "fp32")
CUDA_VARIANT_ORDER = ("fp16", "fp32")


class RuntimeConfigError(RuntimeError):
    """The requested device or variant cannot be honoured; the service must not start on it."""


# Devices that batch like a GPU: big batches, padding almost free, one instance, no compute slots.
# "simulated" is app/engine/simulated.py (benchmarks and tests).
ACCELERATORS = ("cuda", "simulated")


def resolve_device(requested: str, available_providers: list[str]) -> str:
    """'auto' | 'cpu' | 'cuda' | 'simulated' -> itself ('auto': 'cuda' if onnxruntime offers it, else
    'cpu'), given onnxruntime.get_available_providers()."""
    if requested in ("cpu", "simulated"):
        return requested
    has_cuda = CUDA_EP in available_providers
    if requested == "cuda":
        if not has_cuda:
            raise RuntimeConfigError(
                f"DEVICE=cuda but this onnxruntime build offers only {available_providers}; "
                "install onnxruntime-gpu (and CUDA/cuDNN) or set DEVICE=cpu"
            )
        return "cuda"
    if requested != "auto":
        raise RuntimeConfigError(f"DEVICE must be auto, cpu, cuda or simulated, got {requested!r}")
    return "cuda" if has_cuda else "cpu"


def variant_preference(
    device: str, cpu_variant: str = "auto", flags: set[str] | None = None
) -> tuple[str, str]:
    """The variant to serve and why: FP16 on GPU; on CPU, CPU_VARIANT, or with "auto" the fastest exact
    batch-invariant one for this CPU's INT8 kernel, fixed by its flags (`flags`: injected in tests)."""
    if device == "cuda":
        return CUDA_VARIANT_ORDER[0], "fp16 on CUDA"
    if cpu_variant != "auto":
        return cpu_variant, f"CPU_VARIANT={cpu_variant}"
    return cpu_int8_variant(flags=flags)


def variant_choice(
    device: str, variants: Mapping[str, Any], cpu_variant: str = "auto", flags: set[str] | None = None
) -> tuple[str, str]:
    """The variant to serve from `variants` and why (/models and the log say it):
    `variant_preference`, then (int8-rowwise > int8-rowwise-avx2 > int8 > fused > fp32 on CPU,
    fp16 > fp32 on GPU) where a bundle lacks it. Falls back loudly, never silently."""
    preferred, reason = variant_preference(device, cpu_variant, flags)
    rest = CUDA_VARIANT_ORDER if device == "cuda" else CPU_VARIANT_ORDER
    order = list(dict.fromkeys((preferred, *rest)))
    for variant in order:
        if variant == preferred and variant in variants:
            return variant, reason
        if variant in variants:
            log.warning(
                "preferred variant missing, using another",
                extra={"device": device, "preferred": preferred, "reason": reason, "variant": variant},
            )
            return variant, f"{reason}; the bundle lacks {preferred}"
    raise RuntimeConfigError(f"bundle has variants {sorted(variants)}; none of {order} can run on {device}")


def choose_variant(
    device: str, variants: Mapping[str, Any], cpu_variant: str = "auto", flags: set[str] | None = None
) -> str:
    return variant_choice(device, variants, cpu_variant, flags)[0]


def providers_for(device: str) -> list[Any]:
    if device == "cuda":
        # CPU stays listed for the few nodes CUDA lacks kernels for; check_providers still
        # insists that CUDA itself is active.
        return [(CUDA_EP, {"device_id": 0}), CPU_EP]
    return [CPU_EP]


def session_threads(configured: int, n_sessions: int, cores: int) -> int:
    """Explicit INTRA_OP_THREADS, else share the cores between the sessions (at least 1 each)."""
    if configured > 0:
        return configured
    return max(1, cores // max(1, n_sessions))


CPU_PADDING_FACTOR = 1.1  # benchmarks/results/service.md: throughput fell as the factor rose from 1.05 to 2


def resolve_padding_factor(configured: float | None, device: str) -> float:
    """MAX_PADDING_FACTOR, or by device: on a CPU a padded token costs as much as a real one and
    bigger batches gain little, so batches hold near-equal lengths; a GPU pads almost for free."""
    if configured is not None:
        return configured
    return 0.0 if device in ACCELERATORS else CPU_PADDING_FACTOR


# benchmarks/results/batching_sweep_qa.md: /qa at 32 clients served 24.2 requests/s with 1024-token
# batches and 14.2 with 8192 (one 384-token window at a time is fastest per window here).
CPU_BATCH_TOKENS, CUDA_BATCH_TOKENS = 1024, 8192


def resolve_batch_tokens(configured: int | None, device: str) -> int:
    """MAX_BATCH_TOKENS, or by device: on a CPU big batches of long sequences thrash the caches
    and run slower per token than small ones; a GPU needs big batches to fill it."""
    if configured is not None:
        return configured
    return CUDA_BATCH_TOKENS if device in ACCELERATORS else CPU_BATCH_TOKENS


def resolve_instances(configured: int, device: str, cores: int) -> int:
    """MODEL_INSTANCES, or with 0 (auto): on a CPU one single-threaded session per core for every
    model, so batches run side by side and a busy model may use every core the idle ones leave
    (the device's compute slots bound the batches of all models together); one instance on a GPU
    (it batches itself)."""
    if configured > 0:
        return configured
    return 1 if device in ACCELERATORS else max(1, cores)


def check_providers(active: list[str], device: str, model_path: Path | str) -> None:
    """ORT drops the CUDA provider with only a warning when its libraries fail to load: refuse that."""
    if device == "cuda" and CUDA_EP not in active:
        raise RuntimeConfigError(
            f"{Path(model_path).name}: DEVICE resolved to cuda but the session runs on {active}; "
            "CUDA libraries (CUDA 12, cuDNN 9) are probably missing. Refusing to fall back to CPU"
        )


@dataclass(frozen=True)
class SessionTuning:
    """Session and run settings beyond the thread count. The defaults are onnxruntime's own;
    Settings (ORT_MEM_PATTERN, ORT_CPU_ARENA, ORT_ARENA_SHRINKAGE) picks the service's.

    Request shapes vary with every batch. The memory-pattern planner then plans for shapes that
    never recur, and the arena keeps its peak forever; docs/decisions.md (ort_memory) has the numbers.
    """

    spinning: bool = True  # idle intra-op threads spin; off when several sessions share the cores
    stop_spinning_after_run: bool = False  # between runs sleep, leaving the cores to other sessions
    mem_pattern: bool = True
    cpu_arena: bool = True
    arena_shrinkage: bool = False  # give the arena's free chunks back after large runs
    # Shrink only after runs with more padded tokens than this (0 = after every run). Small
    # batches then reuse the arena's pages instead of faulting fresh ones in on every run, while
    # a rare large batch still hands its peak back.
    shrink_above_tokens: int = 0

    def solo(self) -> SessionTuning:
        """The solo session's: spins while it runs (a lone request gets every core), never after."""
        return replace(self, spinning=True, stop_spinning_after_run=True)


class OrtRuntime:
    """`run(inputs) -> outputs` over one InferenceSession; float32 outputs whatever the variant."""

    def __init__(
        self,
        session: Any,
        device: str,
        io_binding: bool | None = None,
        run_options: Any = None,
        run_options_above_tokens: int = 0,
        threads: int | None = None,
    ):
        self.session = session
        self.threads = threads
        self.device = device
        self.io_binding = device == "cuda" if io_binding is None else io_binding
        self.run_options = run_options
        self.run_options_above_tokens = run_options_above_tokens  # runs this small go without them
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        self.providers = list(session.get_providers())

    @property
    def provider(self) -> str:
        return self.providers[0] if self.providers else "unknown"

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise ValueError(f"model inputs {missing} were not provided")
        feed = {n: np.ascontiguousarray(inputs[n], dtype=np.int64) for n in self.input_names}
        options = self.run_options
        if options is not None and feed[self.input_names[0]].size <= self.run_options_above_tokens:
            options = None
        if self.io_binding:
            values = self._run_bound(feed, options)
        elif options is not None:
            values = self.session.run(self.output_names, feed, options)
        else:
            values = self.session.run(self.output_names, feed)
        return {n: np.asarray(v, dtype=np.float32) for n, v in zip(self.output_names, values, strict=True)}

    def _run_bound(self, feed: dict[str, np.ndarray], options: Any) -> list[np.ndarray]:
        # Inputs are copied to the device once; outputs stay there until the final copy back,
        # instead of ORT staging every tensor through pageable host memory per run.
        binding = self.session.io_binding()
        for name, value in feed.items():
            binding.bind_cpu_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, "cuda")
        binding.synchronize_inputs()
        if options is not None:
            self.session.run_with_iobinding(binding, options)
        else:
            self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return binding.copy_outputs_to_cpu()


class RuntimePool:
    """Several sessions of one model: `run` takes whichever is free (thread-safe).

    The batcher runs up to `instances` batches at once, like Triton's instance count. On a CPU,
    two single-threaded sessions side by side outrun one two-threaded session, whose threads
    meet at a barrier after every operator and stall whenever the OS lends one core to the
    HTTP thread.

    A lone request on an idle model would then use one core and leave the others idle: `solo`, a
    session with all the model's cores, runs the batches the batcher finds alone (`run_alone`).
    Its threads give a single request the latency of the whole machine and stop spinning after
    each run, so they hold no core once the single-threaded sessions take over under load.
    """

    def __init__(self, runtimes: list[OrtRuntime], solo: OrtRuntime | None = None):
        if not runtimes:
            raise ValueError("a runtime pool needs at least one runtime")
        self.runtimes = runtimes
        self.solo = solo
        self._solo_lock = threading.Lock()
        # Last in, first out: under light load one session (its weights and arena) stays warm.
        self._free = list(reversed(runtimes))
        self._returned = threading.Condition()

    @property
    def instances(self) -> int:
        return len(self.runtimes)

    @property
    def solo_threads(self) -> int | None:
        return self.solo.threads if self.solo is not None else None

    @property
    def provider(self) -> str:
        return self.runtimes[0].provider

    @property
    def providers(self) -> list[str]:
        return self.runtimes[0].providers

    def run_alone(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a batch that is alone in an idle model on the solo session (if any and free)."""
        if self.solo is not None and self._solo_lock.acquire(blocking=False):
            try:
                return self.solo.run(inputs)
            finally:
                self._solo_lock.release()
        return self.run(inputs)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._returned:
            while not self._free:
                self._returned.wait()
            runtime = self._free.pop()
        try:
            return runtime.run(inputs)
        finally:
            with self._returned:
                self._free.append(runtime)
                self._returned.notify()


def session_options(threads: int, tuning: SessionTuning = SessionTuning(), variant: str | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_mem_pattern = tuning.mem_pattern
    options.enable_cpu_mem_arena = tuning.cpu_arena
    exact_int8(options, variant=variant)  # INT8 answers alike on every CPU (export/int8_precision.py)
    if not tuning.spinning:
        # Several sessions share the cores: idle threads spinning would steal them from each other.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif tuning.stop_spinning_after_run:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


def run_options(tuning: SessionTuning) -> Any:
    """RunOptions for every run, or None when ORT's defaults apply."""
    if not tuning.arena_shrinkage:
        return None
    import onnxruntime as ort

    options = ort.RunOptions()
    # CPU arena only: shrinking the CUDA arena would cudaFree/cudaMalloc around every batch, and
    # the GPU's memory belongs to this model anyway.
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def create_runtime(
    model_path: Path,
    device: str,
    threads: int,
    tuning: SessionTuning = SessionTuning(),
    session_factory: Callable[..., Any] | None = None,
    disabled_optimizers: Sequence[str] = (),
    model_bytes: bytes | None = None,
    external_data_dir: str | None = None,
    variant: str | None = None,
) -> OrtRuntime:
    """One InferenceSession on `device` ('cpu' | 'cuda', already resolved); verifies the provider.
    `disabled_optimizers` comes from the bundle's variant entry (see export/pipeline.py); `variant`
    decides whether INT8 needs the exact widening kernel on this CPU.

    With `model_bytes` (the file's verified contents) the session is made from them, not from the
    file, and ONNX Runtime looks for external data only in `external_data_dir` (the loader passes
    an empty one: no file the manifest does not list and hash is ever read)."""
    if session_factory is None:
        import onnxruntime as ort

        session_factory = ort.InferenceSession
    extra = {"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}
    options = session_options(threads, tuning, variant)
    if external_data_dir is not None:
        folder = "session.model_external_initializers_file_folder_path"
        options.add_session_config_entry(folder, external_data_dir)
    session = session_factory(
        model_bytes if model_bytes is not None else str(model_path),
        sess_options=options,
        providers=providers_for(device),
        **extra,
    )
    check_providers(list(session.get_providers()), device, model_path)
    return OrtRuntime(
        session,
        device,
        run_options=run_options(tuning),
        run_options_above_tokens=tuning.shrink_above_tokens,
        threads=threads,
    )


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())
