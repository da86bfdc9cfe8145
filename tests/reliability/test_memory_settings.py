"""The memory settings chosen by a measurement (docs/decisions.md) reach the real ONNX Runtime sessions."""

from __future__ import annotations

import platform

import pytest

from app.engine.heap import fix_malloc_mmap_threshold
from app.engine.runtime import SessionTuning, run_options, session_options
from app.settings import Settings
from tests.app.conftest import bundle_of, serving


def test_service_defaults_are_the_benchmarked_choice():
    settings = Settings(models_dir="unused")
    assert (settings.ort_mem_pattern, settings.ort_cpu_arena, settings.ort_arena_shrinkage) == (
        False,
        True,
        True,
    )
    assert settings.ort_shrink_above_tokens == 1024
    assert settings.malloc_mmap_threshold == 131072


def test_session_and_run_options_follow_the_tuning():
    options = session_options(2, SessionTuning(mem_pattern=False, cpu_arena=False))
    assert (options.enable_mem_pattern, options.enable_cpu_mem_arena, options.intra_op_num_threads) == (
        False,
        False,
        2,
    )
    defaults = session_options(1)  # SessionTuning() is onnxruntime's own default
    assert defaults.enable_mem_pattern and defaults.enable_cpu_mem_arena
    assert run_options(SessionTuning()) is None
    shrinking = run_options(SessionTuning(arena_shrinkage=True))
    assert shrinking.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"


@pytest.mark.parametrize(
    "mem_pattern, arena, shrinkage, shrinks",
    [(False, True, True, True), (True, False, False, False), (False, False, True, False)],
)
async def test_settings_reach_every_session(models_dir, mem_pattern, arena, shrinkage, shrinks):
    # Shrinking without an arena would make ORT refuse every run: it is dropped, and the bundle loads.
    overrides = {"ort_mem_pattern": mem_pattern, "ort_cpu_arena": arena, "ort_arena_shrinkage": shrinkage}
    async with serving(models_dir, model_instances=2, **overrides) as (app, client):
        for task in ("classify", "ner", "multiple-choice", "qa"):
            for runtime in bundle_of(app, task).runtime.runtimes:
                options = runtime.session.get_session_options()
                assert (options.enable_mem_pattern, options.enable_cpu_mem_arena) == (mem_pattern, arena)
                assert (runtime.run_options is not None) == shrinks
                assert runtime.run_options_above_tokens == 1024
        assert (await client.post("/classify", json={"text": "a good film"})).status_code == 200


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_malloc_mmap_threshold_is_applied_on_glibc():
    assert fix_malloc_mmap_threshold(131072) is True
    assert fix_malloc_mmap_threshold(0) is False  # 0 leaves glibc alone
