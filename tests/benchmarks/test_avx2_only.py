"""benchmarks.avx2_only: the masked /proc/cpuinfo puts the service's rule on the AVX2 branch, and the
masked process runs onnxruntime's real AVX2 kernels (8-bit weights saturate there, the pair budget
stays exact), natively, where this CPU can fault on CPUID."""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import avx2_only
from export.int8_precision import cpu_int8_variant, needs_exact_int8
from tests.export.test_int8_precision import AVX2_SCRIPT, assert_the_avx2_kernel

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx_vnni avx512_bf16 \
amx_bf16 amx_tile amx_int8 avx512_fp16 sha_ni vaes

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f avx512_vnni
"""


def flags(text: str) -> list[set[str]]:
    return [set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")]


def test_the_masked_cpuinfo_is_an_avx2_only_cpu_and_says_it_is_masked(tmp_path):
    masked = avx2_only.mask_cpuinfo(CPUINFO)
    first, second = flags(masked)
    assert first == {"fpu", "sse2", "avx", "avx2", "fma", "f16c", "sha_ni", "vaes"}
    assert second == {"fpu", "avx2"}
    assert masked.count(f"Intel(R) Xeon(R) Processor{avx2_only.MASKED_NOTE}") == 2
    original = flags(CPUINFO)[0]
    assert not needs_exact_int8("x86_64", original) and needs_exact_int8("x86_64", first)
    assert cpu_int8_variant("x86_64", first)[0] == "int8-rowwise-avx2"
    assert cpu_int8_variant("x86_64", original)[0] == "int8-rowwise"


def test_the_command_runs_in_its_own_mount_namespace_with_the_library_preloaded(tmp_path):
    if not shutil.which("unshare"):
        pytest.skip("no unshare (util-linux)")
    command = avx2_only.masked_command(["python", "-c", "pass"], tmp_path / "cpuinfo")
    assert "--mount" in command and command[-3:] == ["python", "-c", "pass"]
    env = avx2_only.environment(Path("/x/mask.so"), {"LD_PRELOAD": "/y/other.so"})
    assert env["LD_PRELOAD"] == "/x/mask.so /y/other.so" and "-AVX512F" in env["GLIBC_TUNABLES"]


def test_the_real_avx2_kernel_natively_under_a_cpuid_mask():
    """The same worst cases as the qemu test, on this CPU's own cores with CPUID masked: 8-bit weights
    must come out wrong (the mask took effect: the non-VNNI kernel ran), pair-budget weights exact."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("CPUID masking is x86-only")
    if not (shutil.which("gcc") or shutil.which("cc")) or not shutil.which("unshare"):
        pytest.skip("benchmarks.avx2_only needs a C compiler and unshare")
    root = Path(__file__).resolve().parents[2]
    result = avx2_only.run(
        [sys.executable, "-c", AVX2_SCRIPT], cwd=root, capture_output=True, text=True, timeout=300
    )
    if result.returncode == avx2_only.NO_CPUID_FAULT:
        pytest.skip("this CPU or kernel cannot fault on CPUID")
    if "unshare failed" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()[-200:]}")
    assert_the_avx2_kernel(result)
