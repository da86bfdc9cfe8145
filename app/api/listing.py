"""What /models and the admin API say about the models: built from the registry, not by a route."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from app.api.openai_schemas import OpenAIModel, OpenAIModelList
from app.api.service_schemas import ModelInfo, ModelsResponse, VersionInfo
from app.errors import ServiceError, hide_paths
from export.bundle import VARIANT_NOTES, batch_invariant

if TYPE_CHECKING:
    from app.engine.table import Model
    from app.engine.table import ModelTable as Registry

MB = 1 << 20


def list_models(registry: Registry) -> ModelsResponse:
    infos = [model_info(registry, model) for model in registry.models.values()]
    used = [i.memory_mb for i in infos if i.memory_mb is not None and i.status == "ready"]
    return ModelsResponse(
        models=infos,
        memory_mb=round(sum(used), 1) if used else None,
        max_models_memory_mb=registry.settings.max_models_memory_mb,
    )


def openai_model_list(registry: Registry) -> OpenAIModelList:
    """/v1/models: the models with a version serving now."""
    return OpenAIModelList(
        data=[
            OpenAIModel(id=model.name, created=unix_time(model.current.manifest.created_at))
            for model in registry.models.values()
            if model.current is not None and model.status != "unloaded"
        ]
    )


def unix_time(iso: str) -> int:
    try:
        return int(datetime.fromisoformat(iso).timestamp())
    except ValueError:
        return 0


def relative(path: str, models_dir: Path) -> str:
    """A version's directory as answers show it: relative to MODELS_DIR (`news-topics/2`)."""
    try:
        return str(Path(path).resolve().relative_to(models_dir.resolve()))
    except ValueError:
        return Path(path).name


def model_info(registry: Registry, model: Model) -> ModelInfo:
    """What /models (and the admin API) say about one model and its serving version."""
    settings = registry.settings
    limits: dict[str, int | float | str] = {
        "max_batch_size": settings.max_batch_size,
        "max_wait_ms": settings.max_wait_ms,
        "max_queue": settings.max_queue,
        "max_in_flight": settings.max_in_flight,
        "max_body_bytes": settings.max_body_bytes,
        "max_text_chars": settings.max_text_chars,
        "max_qa_context_chars": settings.max_qa_context_chars,
        "max_batch_items": settings.max_batch_items,
        "max_choices": settings.max_choices,
        "classify_long_text": settings.classify_long_text,
    }
    bundle = model.current
    root = Path(settings.models_dir)
    info = ModelInfo(
        name=model.name,
        task=model.task,
        status=model.status,
        error=hide_paths(model.error, root),
        default=model.task is not None and registry.default_name(model.task) == model.name,
        rerank_default=model.task == "classify" and rerank_default(registry) == model.name,
        versions=[
            VersionInfo(
                **{**vars(event), "path": relative(event.path, root), "error": hide_paths(event.error, root)}
            )
            for event in model.history
        ],
        limits=limits,
    )
    if bundle is None:
        return info
    manifest, runtime, batcher = bundle.manifest, bundle.runtime, bundle.batcher
    if batcher is not None:  # the limits in force, device-dependent defaults resolved
        limits.update(
            max_batch_tokens=batcher.max_batch_tokens, max_padding_factor=batcher.max_padding_factor
        )
    return info.model_copy(
        update=dict(
            path=relative(str(bundle.path), root),
            version=bundle.version,
            digest=bundle.digest,
            memory_mb=None if bundle.memory_bytes is None else round(bundle.memory_bytes / MB, 1),
            in_flight=bundle.leases,
            labels=manifest.labels,
            problem_type=manifest.problem_type,
            variant=bundle.variant,
            precision=manifest.variants[bundle.variant].precision if bundle.variant else None,
            batch_invariant=batch_invariant(bundle.variant, bundle.device) if bundle.variant else None,
            variant_note=VARIANT_NOTES.get(bundle.variant) if bundle.variant else None,
            variant_reason=bundle.variant_reason,
            device=bundle.device,
            execution_provider=runtime.provider if runtime else None,
            providers=runtime.providers if runtime else [],
            intra_op_threads=bundle.threads,
            instances=runtime.instances if runtime else None,
            solo_threads=runtime.solo_threads if runtime else None,
            max_seq_len=manifest.max_seq_len,
            qa_defaults=manifest.qa_defaults if manifest.task == "qa" else None,
            pooling={k: v for k, v in manifest.pooling.items() if k != "source"}
            if manifest.pooling
            else None,
            load_seconds=bundle.load_seconds,
            limits=limits,
        )
    )


def rerank_default(registry: Registry) -> str | None:
    """The model /rerank serves when none is named, or None while there is no single one."""
    try:
        return registry.reranker(None)
    except ServiceError:
        return None
