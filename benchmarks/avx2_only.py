"""Run a command as if on an AVX2-only x86 CPU, on this machine's own silicon
(`python -m benchmarks.avx2_only -- python -m benchmarks.cpu_int8 --name cpu_int8_masked`).

Issue 44's rows need onnxruntime's AVX2 kernels, which MLAS picks by CPUID. On a CPU with AVX-512,
VNNI or AMX this runs the command with CPUID masked (`avx2_only.c`, through CPUID faulting: the
`cpuid_fault` flag) and with a copy of /proc/cpuinfo without those flags bind-mounted in a private
mount namespace (so the service's variant rule, export/int8_precision.py, sees the same CPU). The
copy's model name says it is masked, so every results file that names the CPU says so too.

What it is and is not: the AVX2 code paths, timed natively here (qemu only emulates them, far too
slowly to time). Not an AVX2-only host: the cores, caches and clocks stay this CPU's, so its numbers
are no AVX2 host's rows (docs/performance.md section 7). Needs root or user namespaces, gcc, and
CPUID faulting; it says which is missing and exits non-zero rather than run unmasked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(__file__).with_suffix(".c")
MASKED_NOTE = " (CPUID masked to AVX2-only by benchmarks.avx2_only)"
# Linux's names for what avx2_only.c clears (plus any later AVX-512, AMX or VNNI flag).
MASKED_FLAGS = frozenset({"avx_ifma", "avx_ne_convert", "avx10"})
NO_CPUID_FAULT = 97  # avx2_only.c's exit status where CPUID faulting is unavailable


def masked(flag: str) -> bool:
    return flag.startswith(("avx512", "amx")) or "vnni" in flag or flag in MASKED_FLAGS


def mask_cpuinfo(text: str) -> str:
    """/proc/cpuinfo as the masked CPU reads: no AVX-512, VNNI or AMX flags, the model name marked."""
    lines = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            line = f"{key}: {' '.join(flag for flag in value.split() if not masked(flag))}"
        elif sep and key.strip() == "model name":
            line = f"{key}: {value.strip()}{MASKED_NOTE}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def library(cache: Path = ROOT / ".cache" / "avx2_only") -> Path:
    """avx2_only.c compiled once per version of its source."""
    source = SOURCE.read_bytes()
    target = cache / f"cpuid_mask-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if not target.is_file():
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            raise SystemExit("avx2_only: needs a C compiler (apt-get install gcc)")
        cache.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE)], check=True)
        partial.replace(target)
    return target


def masked_command(command: list[str], cpuinfo: Path) -> list[str]:
    """`command` in a private mount namespace that sees `cpuinfo` as /proc/cpuinfo."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SystemExit("avx2_only: needs unshare (util-linux)")
    namespace = ["--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        namespace = ["--user", "--map-root-user", *namespace]
    mount = 'mount --bind "$0" /proc/cpuinfo && exec "$@"'
    return [unshare, *namespace, "--", "sh", "-c", mount, str(cpuinfo), *command]


def environment(preload: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(preload), env.get("LD_PRELOAD", "")]))
    # glibc reads CPUID before any preload runs; this keeps its string functions off AVX-512 too.
    env["GLIBC_TUNABLES"] = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512CD,-AVX512DQ"
    return env


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run `command` masked (kwargs go to subprocess.run); exit status 97: no CPUID faulting here."""
    real = Path("/proc/cpuinfo").read_text()
    with tempfile.TemporaryDirectory(prefix="avx2_only-") as tmp:
        cpuinfo = Path(tmp) / "cpuinfo"
        cpuinfo.write_text(mask_cpuinfo(real))
        env = environment(library(), kwargs.pop("env", None))
        return subprocess.run(masked_command(command, cpuinfo), env=env, **kwargs)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    if not command:
        print(__doc__)
        return 2
    code = run(command, cwd=ROOT).returncode
    if code == NO_CPUID_FAULT:
        print("avx2_only: no CPUID faulting on this CPU or kernel; nothing was run masked", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
