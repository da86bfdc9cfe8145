"""The admin API: load, reload and unload models by name, or apply MODELS_DIR's changes now.

Off unless ADMIN_API_KEY is set; then every call needs `Authorization: Bearer <ADMIN_API_KEY>`
(a key of its own: API_KEY does not open it). A model is named, never given as a path: only
directories directly inside MODELS_DIR can be loaded, and every file is checked against the
sha256 in its bundle.json before onnxruntime reads it.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from app.api.error_table import ADMIN_RESPONSES
from app.api.listing import model_info
from app.api.routes import state_of
from app.api.service_schemas import LoadResponse, PollResponse, UnloadResponse
from app.errors import AdminDisabled


async def require_admin_key(request: Request) -> None:
    key = state_of(request).settings.admin_api_key
    if key is None:  # with a key, AuthMiddleware has checked it before the body was read
        raise AdminDisabled("the admin API is off: set ADMIN_API_KEY to turn it on")


router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin_key)])


@router.post(
    "/models/{name}/load",
    response_model=LoadResponse,
    responses=ADMIN_RESPONSES,
    summary="Load a model's newest version from MODELS_DIR, or reload it when its files changed",
)
async def load(name: str, request: Request) -> LoadResponse:
    state = state_of(request)
    model, changed = await state.control.load(name)
    return LoadResponse(changed=changed, model=model_info(state.registry, model))


@router.post(
    "/models/{name}/unload",
    response_model=UnloadResponse,
    responses=ADMIN_RESPONSES,
    summary="Stop serving a model once the requests it is answering are done",
)
async def unload(name: str, request: Request) -> UnloadResponse:
    state = state_of(request)
    model, waited = await state.control.unload(name)
    return UnloadResponse(waited_s=round(waited, 3), model=model_info(state.registry, model))


@router.post(
    "/poll",
    response_model=PollResponse,
    responses=ADMIN_RESPONSES,
    summary="Apply MODELS_DIR's changes now, as MODEL_POLL_S does periodically",
)
async def poll(request: Request) -> PollResponse:
    return PollResponse(**await state_of(request).control.poll())
