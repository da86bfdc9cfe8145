"""bf16 autocast is chosen, and is quiet, only where the CPU multiplies bf16 natively: one rule
(`train.trainer.cpu_has_fast_bf16`) for the trainer's warning and the fine-tuning recipes, tested
for every CPU class through injected flags."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from export import int8_precision
from train.trainer import Trainer, cpu_has_fast_bf16

AVX2_ONLY = {"fpu", "sse", "avx", "avx2", "fma"}
AVX512_BF16 = {"fpu", "avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
AMX = {"fpu", "avx2", "amx_bf16", "amx_tile"}


@pytest.mark.parametrize(
    ("flags", "fast"), [(AVX2_ONLY, False), (AVX512_BF16, True), (AMX, True), (set(), False)]
)
def test_native_bf16_by_the_cpus_flags(flags, fast):
    assert cpu_has_fast_bf16(flags) is fast


def test_reads_the_real_flags_by_default(monkeypatch):
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda cpuinfo=None: set(AMX))
    assert cpu_has_fast_bf16()
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda cpuinfo=None: set())
    assert not cpu_has_fast_bf16(), "no /proc/cpuinfo: fp32, the safe choice"


@pytest.mark.parametrize(("flags", "warned"), [(AVX2_ONLY, True), (AVX512_BF16, False)])
def test_the_trainer_warns_where_bf16_is_emulated(monkeypatch, caplog, flags, warned):
    monkeypatch.setattr(int8_precision, "cpu_flags", lambda cpuinfo=None: set(flags))
    trainer = SimpleNamespace(config=SimpleNamespace(precision="bf16"), device=torch.device("cpu"))
    with caplog.at_level(logging.WARNING):
        Trainer.setup_precision(trainer)
    assert ("emulated" in caplog.text) is warned
    with trainer.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
