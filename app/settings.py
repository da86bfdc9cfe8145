"""Service configuration, read from environment variables (no prefix) by pydantic-settings."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from processing.tasks import TASK_NAMES


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    models_dir: Path = Field(Path("models"), description="Directory whose sub-directories are bundles")
    api_servers: int = Field(
        1, ge=1, description="Front-end processes; above 1, one engine process serves them (app/serve.py)"
    )
    device: Literal["auto", "cpu", "cuda", "simulated"] = "auto"
    simulated_batch_ms: float = Field(
        2.0, gt=0, description="DEVICE=simulated: wall time per batch of up to MAX_BATCH_SIZE rows, no CPU"
    )
    cpu_variant: Literal["auto", "int8-rowwise", "int8-rowwise-avx2", "int8", "fused", "fp32"] = Field(
        "auto",
        description="auto: the fastest exact batch-invariant INT8 variant for this CPU (int8-rowwise with "
        "VNNI/AMX, int8-rowwise-avx2 without); a name forces that variant",
    )
    intra_op_threads: int = Field(0, ge=0, description="ORT threads per session; 0 = cores / sessions")
    model_instances: int = Field(
        0,
        ge=0,
        description="Sessions per model running batches side by side; 0 = auto (see app/engine/runtime.py)",
    )
    solo_session: bool = Field(
        True,
        description="CPU, one model with several sessions: one more session with all its cores runs a "
        "batch alone in the idle model (single-request latency); off saves that session's memory",
    )
    max_batch_size: int = Field(32, ge=1)
    max_batch_tokens: int | None = Field(
        None, ge=1, description="Padded tokens per batch (longest x rows); unset = 1024 on CPU, 8192 on CUDA"
    )
    max_padding_factor: float | None = Field(
        None,
        ge=0,
        description="A batch's padded tokens at most this multiple of its real tokens; 0 = off; "
        "unset = 1.1 on CPU (padding costs as much as real tokens there), off on CUDA",
    )
    inline_batch_tokens: int = Field(
        128,
        ge=0,
        description="CPU: a batch this small, alone in an idle model, runs on the event loop (no thread hop)",
    )
    max_wait_ms: float = Field(0.0, ge=0, description="0 = continuous batching (no wait)")
    max_queue: int = Field(512, ge=1, description="Queued work items per model before 429")
    max_queue_ms: float = Field(
        5000.0,
        ge=0,
        description="A request without timeout_ms whose work is still queued this long gets 503 with "
        "Retry-After; 0 = no server deadline",
    )
    priority_aging_ms: float = Field(
        500.0, ge=0, description="Normal-priority work queued this long is batched as if it were high"
    )
    max_in_flight: int = Field(
        128, ge=1, description="Requests per task endpoint being served at once before 429"
    )
    max_body_bytes: int = Field(1 << 20, ge=1024)
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Also serve the Open Inference Protocol over gRPC (KServe V2; Triton uses 8001) on this "
        "port; unset = off",
    )
    grpc_host: str = Field("0.0.0.0", description="The address GRPC_PORT listens on")
    # The connection layer below ASGI (app/api/connections.py): what a proxy would otherwise enforce.
    header_timeout_s: float = Field(
        10.0, gt=0, description="A request's line and headers must arrive within this many seconds (408)"
    )
    max_header_bytes: int = Field(32768, ge=1024, description="A request's line and headers, in bytes (431)")
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request's whole body must arrive within this s after its headers (408)"
    )
    max_pending_body_mb: float = Field(
        64.0, gt=0, description="Memory that all bodies still arriving may hold together (503 beyond)"
    )
    max_connections: int = Field(
        0,
        ge=0,
        description="Open connections; 0 = min(4096, open-file limit - 128). At the cap a new connection "
        "closes the oldest one still sending its request line and headers (or idle), else it gets 503",
    )
    refusal_delay_ms: float = Field(
        1000.0,
        ge=0,
        le=10_000,
        description="Refusals made before the app parses a request (a missing key, counts over the limits, "
        "bodies over MAX_PENDING_BODY_MB) are answered after this delay",
    )
    max_text_chars: int = Field(20_000, ge=1)
    max_qa_context_chars: int = Field(100_000, ge=1)
    max_batch_items: int = Field(64, ge=1)
    max_choices: int = Field(16, ge=2)
    window_overlap: int | None = Field(
        None, ge=0, description="Tokens shared by NER / classify windows (unset: the bundle's own)"
    )
    api_key: SecretStr | None = None
    admin_api_key: SecretStr | None = Field(
        None, description="Bearer key of the admin API (load/unload models); unset = the admin API is off"
    )
    model_poll_s: float = Field(0.0, ge=0, description="Apply MODELS_DIR's changes every N seconds; 0 = off")
    max_load_s: float = Field(
        300.0,
        ge=0,
        description="A version whose loading and warm-up take longer is refused and its sessions dropped; "
        "0 = no limit",
    )
    max_models_memory_mb: float | None = Field(
        None, gt=0, description="Most resident memory all loaded models may take; unset = no limit"
    )
    response_cache_mb: float = Field(
        0.0, ge=0, description="Memory for cached answers of the task routes (LRU); 0 = no cache"
    )
    cors_origins: str = ""
    log_level: str = "INFO"
    default_bundles: str = ""
    classify_long_text: Literal["truncate", "windows"] = "truncate"
    # Request shapes vary per batch: SessionTuning in app/engine/runtime.py, docs/decisions.md (ort_memory).
    ort_spinning: Literal["auto", "on", "off"] = Field(
        "auto", description="Idle ORT threads spin-wait; auto = on only when one model has the cores"
    )
    ort_mem_pattern: bool = Field(False, description="ORT memory-pattern planning (for fixed shapes)")
    ort_cpu_arena: bool = Field(True, description="ORT's CPU memory arena")
    ort_arena_shrinkage: bool = Field(True, description="Return the arena's free memory after large runs")
    ort_shrink_above_tokens: int = Field(
        1024, ge=0, description="Large = more padded tokens than this in the batch; 0 = every run"
    )
    malloc_mmap_threshold: int = Field(
        131072, ge=0, description="glibc: allocations this large or larger use mmap; 0 = glibc's own"
    )
    shutdown_grace_s: float = Field(30.0, ge=0, description="How long shutdown waits for in-flight work")

    @field_validator("api_key", "admin_api_key", "grpc_port", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:  # `KEY=` in a compose or env file: unset
        return None if value in ("", None) else value

    @model_validator(mode="after")
    def _admin_key_is_its_own(self) -> Settings:
        # Whoever may call the model endpoints must not be able to swap the models.
        if self.admin_api_key is not None and self.api_key is not None:
            if self.admin_api_key.get_secret_value() == self.api_key.get_secret_value():
                raise ValueError("ADMIN_API_KEY must differ from API_KEY")
        return self

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"):
            raise ValueError(f"LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {value!r}")
        return level

    @field_validator("default_bundles")
    @classmethod
    def _parse_defaults(cls, value: str) -> str:
        parse_default_bundles(value)  # raise early on a malformed value
        return value

    @property
    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]

    @property
    def default_bundle_map(self) -> dict[str, str]:
        return parse_default_bundles(self.default_bundles)


# DEFAULT_BUNDLES keys that name a route's default, not a task's, and the task its model serves.
DEFAULT_ROUTES = {"rerank": "classify"}


def parse_default_bundles(value: str) -> dict[str, str]:
    """'qa=squad-minilm,ner=conll' -> {'qa': 'squad-minilm', 'ner': 'conll'}."""
    out: dict[str, str] = {}
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        task, sep, name = part.partition("=")
        task, name = task.strip(), name.strip()
        if not sep or not name:
            raise ValueError(f"DEFAULT_BUNDLES entry {part!r} must look like task=bundle-name")
        if task not in TASK_NAMES and task not in DEFAULT_ROUTES:
            raise ValueError(
                f"DEFAULT_BUNDLES names unknown task {task!r}; tasks are {', '.join(TASK_NAMES)} "
                f"(and {', '.join(DEFAULT_ROUTES)})"
            )
        out[task] = name
    return out


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"


def cgroup_cpu_limit(path: Path = CGROUP_CPU_MAX) -> int | None:
    """Whole CPUs a cgroup v2 quota allows (Docker `--cpus`, Kubernetes `limits.cpu`), rounded
    up; None without a quota."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def available_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Cores this process may use: its CPU affinity (taskset, cpusets), capped by a cgroup CPU
    quota, which a container's affinity does not show."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = max(1, os.cpu_count() or 1)
    limit = cgroup_cpu_limit(cpu_max)
    return min(cores, limit) if limit else cores
