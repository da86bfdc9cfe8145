"""Run a command as if on an x86 CPU without VNNI or AMX, on this machine's own silicon
(`python -m benchmarks.cpu_mask [--cpu avx2|avx512] -- python -m benchmarks.cpu_int8 --name NAME`).

Issue 44's rows need onnxruntime's kernels for CPUs whose u8 x s8 products add in 16 bits, which
MLAS picks by CPUID. On a CPU with VNNI or AMX this runs the command with CPUID masked
(`cpu_mask.c`, through CPUID faulting: the `cpuid_fault` flag) and with a copy of /proc/cpuinfo
masked alike, bind-mounted in a private mount namespace (so the service's variant rule,
export/int8_precision.py, sees the same CPU). `--cpu avx2` (the default) is an AVX2-only CPU (AMD
EPYC Zen 2/3); `--cpu avx512` keeps AVX-512 F/DQ/CD/BW/VL, an AVX-512 CPU without VNNI (Skylake-SP),
whose own kernel the pair budget's exactness was otherwise only read for. The copy's model name
says it is masked, so every results file that names the CPU says so too.

What it is and is not: those kernels, run and timed natively here (qemu only emulates AVX2, far too
slowly to time, and not AVX-512). Not such a host: the cores, caches and clocks stay this CPU's, so
its numbers are no AVX2 host's rows (docs/performance.md section 7). Needs root or user namespaces,
a C compiler, unshare and CPUID faulting; it says which is missing and exits non-zero rather than
run unmasked.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(__file__).with_suffix(".c")
# --cpu -> what the masked CPU is; the note ends its model name in /proc/cpuinfo.
PROFILES = {"avx2": "AVX2-only", "avx512": "AVX-512 without VNNI"}
MASKED_MARK = "(CPUID masked to "
# What a Skylake-SP has of AVX-512 (what --cpu avx512 keeps); cpu_mask.c clears the rest.
SKYLAKE_AVX512 = frozenset({"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"})
LATER_FLAGS = frozenset({"avx_ifma", "avx_ne_convert", "avx10"})
NO_CPUID_FAULT = 97  # cpu_mask.c's exit status where CPUID faulting is unavailable


def masked_note(cpu: str) -> str:
    return f" {MASKED_MARK}{PROFILES[cpu]} by benchmarks.cpu_mask)"


def wrapper() -> list[str]:
    """How this process was started under the mask (`run` sets CPUID_MASK), for results' command lines."""
    cpu = os.environ.get("CPUID_MASK")
    if not cpu:
        return []
    return ["python", "-m", "benchmarks.cpu_mask", *(["--cpu", cpu] if cpu != "avx2" else []), "--"]


def masked(flag: str, cpu: str = "avx2") -> bool:
    """Whether the masked CPU lacks `flag` (Linux's name): VNNI, AMX, and AVX-512 beyond the profile."""
    if cpu == "avx512" and flag in SKYLAKE_AVX512:
        return False
    return flag.startswith(("avx512", "amx")) or "vnni" in flag or flag in LATER_FLAGS


def mask_cpuinfo(text: str, cpu: str = "avx2") -> str:
    """/proc/cpuinfo as the masked CPU reads: its flags only, the model name marked."""
    lines = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            line = f"{key}: {' '.join(flag for flag in value.split() if not masked(flag, cpu))}"
        elif sep and key.strip() == "model name":
            line = f"{key}: {value.strip()}{masked_note(cpu)}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def library(cache: Path = ROOT / ".cache" / "cpu_mask") -> Path:
    """cpu_mask.c compiled once per version of its source."""
    source = SOURCE.read_bytes()
    target = cache / f"cpu_mask-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if not target.is_file():
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            raise SystemExit("cpu_mask: needs a C compiler (apt-get install gcc)")
        cache.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        built = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE)],
            capture_output=True,
            text=True,
        )
        if built.returncode:
            raise SystemExit(f"cpu_mask: could not compile {SOURCE.name}:\n{built.stderr[-1000:]}")
        partial.replace(target)
    return target


def masked_command(command: list[str], cpuinfo: Path) -> list[str]:
    """`command` in a private mount namespace that sees `cpuinfo` as /proc/cpuinfo."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SystemExit("cpu_mask: needs unshare (util-linux)")
    namespace = ["--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        namespace = ["--user", "--map-root-user", *namespace]
    mount = 'mount --bind "$0" /proc/cpuinfo && exec "$@"'
    return [unshare, *namespace, "--", "sh", "-c", mount, str(cpuinfo), *command]


def environment(preload: Path, cpu: str = "avx2", base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(preload), env.get("LD_PRELOAD", "")]))
    env["CPUID_MASK"] = cpu
    if cpu == "avx2":  # glibc reads CPUID before any preload runs: keep its string functions off AVX-512
        env["GLIBC_TUNABLES"] = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512CD,-AVX512DQ"
    return env


def run(command: list[str], cpu: str = "avx2", **kwargs) -> subprocess.CompletedProcess:
    """Run `command` masked as `cpu` (kwargs go to subprocess.run); exit status 97: no CPUID faulting."""
    real = Path("/proc/cpuinfo").read_text()
    with tempfile.TemporaryDirectory(prefix="cpu_mask-") as tmp:
        cpuinfo = Path(tmp) / "cpuinfo"
        cpuinfo.write_text(mask_cpuinfo(real, cpu))
        env = environment(library(), cpu, kwargs.pop("env", None))
        return subprocess.run(masked_command(command, cpuinfo), env=env, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", choices=sorted(PROFILES), default="avx2")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    code = run(command, args.cpu, cwd=ROOT).returncode
    if code == NO_CPUID_FAULT:
        print("cpu_mask: no CPUID faulting on this CPU or kernel; nothing was run masked", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
