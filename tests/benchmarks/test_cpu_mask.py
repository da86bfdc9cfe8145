"""benchmarks.cpu_mask: the masked /proc/cpuinfo puts the service's rule on the 16-bit-pairs branch,
and the masked process runs onnxruntime's real kernels for CPUs without VNNI (8-bit weights saturate
there, the pair budget stays exact), natively, where this CPU can fault on CPUID."""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import bench_common, cpu_mask
from export.int8_precision import cpu_flags, cpu_int8_variant, needs_exact_int8
from tests.export.test_int8_precision import AVX2_SCRIPT, assert_the_avx2_kernel

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx_vnni \
avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16 avx512vbmi sha_ni vaes

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f avx512_vnni
"""
BASE = {"fpu", "sse2", "avx", "avx2", "fma", "f16c", "sha_ni", "vaes"}


def flags(text: str) -> list[set[str]]:
    return [set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")]


@pytest.mark.parametrize(
    "cpu, kept, name",
    [
        ("avx2", set(), "AVX2-only"),
        ("avx512", {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}, "AVX-512 without VNNI"),
    ],
)
def test_the_masked_cpuinfo_lacks_vnni_and_says_it_is_masked(cpu, kept, name):
    masked = cpu_mask.mask_cpuinfo(CPUINFO, cpu)
    first, second = flags(masked)
    assert first == BASE | kept and second == {"fpu", "avx2"} | kept & {"avx512f"}
    note = f"Intel(R) Xeon(R) Processor (CPUID masked to {name} by benchmarks.cpu_mask)"
    assert masked.count(note) == 2 and cpu_mask.MASKED_MARK in note
    original = flags(CPUINFO)[0]
    assert not needs_exact_int8("x86_64", original) and needs_exact_int8("x86_64", first)
    assert cpu_int8_variant("x86_64", first)[0] == "int8-rowwise-avx2"
    assert cpu_int8_variant("x86_64", original)[0] == "int8-rowwise"


@pytest.mark.parametrize(
    "mask, prefix",
    [
        (None, ""),
        ("avx2", "python -m benchmarks.cpu_mask -- "),
        ("avx512", "python -m benchmarks.cpu_mask --cpu avx512 -- "),
    ],
)
def test_a_results_file_records_the_mask_its_command_ran_under(monkeypatch, mask, prefix):
    if mask is None:
        monkeypatch.delenv("CPUID_MASK", raising=False)
    else:
        monkeypatch.setenv("CPUID_MASK", mask)
    line = bench_common.command("cpu_int8", ["--name", "x"])
    assert line == prefix + "python -m benchmarks.cpu_int8 --name x"


def test_the_command_runs_in_its_own_mount_namespace_with_the_library_preloaded(tmp_path):
    if not shutil.which("unshare"):
        pytest.skip("no unshare (util-linux)")
    command = cpu_mask.masked_command(["python", "-c", "pass"], tmp_path / "cpuinfo")
    assert "--mount" in command and command[-3:] == ["python", "-c", "pass"]
    env = cpu_mask.environment(Path("/x/mask.so"), "avx2", {"LD_PRELOAD": "/y/other.so"})
    assert env["LD_PRELOAD"] == "/x/mask.so /y/other.so" and env["CPUID_MASK"] == "avx2"
    assert "-AVX512F" in env["GLIBC_TUNABLES"]
    assert "GLIBC_TUNABLES" not in cpu_mask.environment(Path("/x/mask.so"), "avx512", {})


def require_the_mask() -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("CPUID masking is x86-only")
    if not (shutil.which("gcc") or shutil.which("cc")) or not shutil.which("unshare"):
        pytest.skip("benchmarks.cpu_mask needs a C compiler and unshare")
    try:
        cpu_mask.library()
    except SystemExit as error:  # a compiler without libc's headers, say
        pytest.skip(str(error))


def run_masked(script: str, cpu: str, timeout: int):
    """`python -c script` from the repository root under the mask; skips where it cannot be masked."""
    root = Path(__file__).resolve().parents[2]
    result = cpu_mask.run(
        [sys.executable, "-c", script], cpu, cwd=root, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode == cpu_mask.NO_CPUID_FAULT:
        pytest.skip("this CPU or kernel cannot fault on CPUID")
    if "unshare failed" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()[-200:]}")
    return result


@pytest.mark.parametrize("cpu", ["avx2", "avx512"])
def test_the_real_kernels_without_vnni_natively_under_a_cpuid_mask(cpu):
    """The same worst cases as the qemu test, on this CPU's own cores with CPUID masked: 8-bit weights
    must come out wrong (the mask took effect: a kernel adding pairs in 16 bits ran), pair-budget
    weights exact. `avx512` is MLAS's AVX-512 kernel without VNNI, which qemu cannot emulate."""
    require_the_mask()
    if cpu == "avx512" and "avx512bw" not in cpu_flags():
        pytest.skip("this CPU has no AVX-512 to keep")
    assert_the_avx2_kernel(run_masked(AVX2_SCRIPT, cpu, timeout=300))


DEFAULTS_SCRIPT = """
import numpy as np
import onnxruntime as ort
from export.bundle import load_bundle_manifest
from export.int8_precision import exact_int8
from export.verify import run_session, verification_cases

for name in {names!r}:
    bundle = {bundles!r} + "/" + name
    manifest = load_bundle_manifest(bundle)
    for variant in ("int8-rowwise", "int8-rowwise-avx2"):
        spec, sessions = manifest.variants[variant], []
        for widening in (False, True):  # the fast kernel; the exact widening one
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            exact_int8(options, needed=widening)
            disabled = list(spec.disabled_optimizers or [])
            sessions.append(ort.InferenceSession(
                f"{{bundle}}/{{spec.file}}", options, providers=["CPUExecutionProvider"],
                disabled_optimizers=disabled,
            ))
        worst = 0.0
        for case in verification_cases(manifest.task, 1000, 64):
            fast, wide = (run_session(session, case.feeds) for session in sessions)
            worst = max(worst, max(float(np.abs(fast[k] - wide[k]).max()) for k in fast))
        print(name, variant, worst)
"""


@pytest.mark.slow
def test_the_default_bundles_avx2_variant_is_exact_on_the_fast_kernels():
    """All six defaults, on the real kernels without VNNI (CPUID masked): `int8-rowwise-avx2` on the
    fast kernel answers bit for bit as on the exact widening one, while 8-bit `int8-rowwise` there
    moves (so the comparison can fail). Skipped before `make serve` builds the bundles."""
    from tests.export.test_invariance import DEFAULT_BUNDLES, DEFAULT_NAMES

    names = list(DEFAULT_NAMES)
    if not all((DEFAULT_BUNDLES / name / "bundle.json").is_file() for name in names):
        pytest.skip("the default bundles are not built (make serve)")
    require_the_mask()
    script = DEFAULTS_SCRIPT.format(names=names, bundles=str(DEFAULT_BUNDLES))
    result = run_masked(script, "avx2", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    worst = {tuple(line.split()[:2]): float(line.split()[2]) for line in result.stdout.splitlines()}
    assert len(worst) == 12, result.stdout
    assert all(worst[(name, "int8-rowwise-avx2")] == 0.0 for name in names), worst
    assert all(worst[(name, "int8-rowwise")] > 0.0 for name in names), worst


def test_a_library_that_does_not_compile_is_refused_with_the_compilers_words(tmp_path, monkeypatch):
    if not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("no C compiler")
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C;\n")
    monkeypatch.setattr(cpu_mask, "SOURCE", broken)
    with pytest.raises(SystemExit, match="could not compile broken.c") as raised:
        cpu_mask.library(tmp_path / "cache")
    assert "error" in str(raised.value) and not list((tmp_path / "cache").glob("*.so"))
