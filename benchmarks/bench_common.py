"""What every benchmark shares: model locations, the checkpoint a bundle was built from, dev and tiny
models, the machine description, line fits, the one timing loop, results writer, free port and server
launcher. Torch is imported only where a checkpoint is built."""

from __future__ import annotations

import json
import math
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / ".cache" / "bench"
TINY_MODELS = ROOT / ".cache" / "soak" / "tiny-models"

# task -> (bundle name made by `python -m export.defaults`, training run under runs/)
DEFAULT_MODELS = {
    "classify": ("sst2-minilm", "sst2"),
    "ner": ("conll03-minilm", "conll"),
    "multiple-choice": ("codah-minilm", "codah"),
    "qa": ("squad-minilm", "squad"),
}
# Development stand-ins: MiniLM encoder + random head, same sequence limits as the defaults.
DEV_MAX_SEQ_LEN = {"classify": 128, "ner": 128, "qa": 384}
DEV_LABELS = {
    "classify": {0: "negative", 1: "positive"},
    "ner": dict(enumerate(["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"])),
}


def default_bundle(task: str) -> Path:
    return ROOT / ".cache" / "bundles" / DEFAULT_MODELS[task][0]


def default_checkpoint(task: str) -> Path:
    return ROOT / "runs" / DEFAULT_MODELS[task][1] / "best"


ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
MEASURED = "torch onnxruntime onnx transformers numpy fastapi uvicorn tokenizers psutil".split()


def machine_info(threads: int | None = None) -> dict[str, Any]:
    """CPU model, cores, memory, OS and the versions of the packages the benchmarks measure."""
    import platform
    from importlib import metadata

    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    try:  # psutil comes with the dev extras; a training environment may lack it
        import psutil

        memory = {"physical_cores": psutil.cpu_count(logical=False)}
        memory["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        memory = {}
    return {
        "cpu": names[0] if names else platform.processor() or "unknown",
        "logical_cores": os.cpu_count(),
        "threads_used": threads or os.cpu_count() or 1,
        "load_average_at_start": list(os.getloadavg()),
        "os": platform.platform(),
        "python": platform.python_version(),
        # The model name does not tell an AVX2-only EPYC from an AVX512-VNNI one; these flags do,
        # and they decide the INT8 kernels (and the bf16 speed) measured.
        "isa": isa_flags(),
        "versions": {package: version(package) for package in MEASURED},
        **memory,
    }


def isa_flags() -> list[str]:
    """Which of the vector extensions that change these benchmarks' kernels the CPU has."""
    from export.int8_precision import cpu_flags

    flags = cpu_flags()
    return [flag for flag in ISA_FLAGS if flag in flags]


def require_bundle(path: Path, task: str) -> Path:
    """`path` must hold a bundle.json for `task`; the error says how to make one."""
    from export.bundle import load_bundle_manifest

    if not (path / "bundle.json").is_file():
        raise SystemExit(
            f"no bundle at {path}: build the defaults with `python -m export.defaults --out .cache/bundles`, "
            f"pass another bundle directory, or use --dev-models (MiniLM with a random {task} head)"
        )
    manifest = load_bundle_manifest(path)
    if manifest.task != task:
        raise SystemExit(f"{path} is a {manifest.task!r} bundle, expected {task!r}")
    return path


def resolve_checkpoint(bundle: Path, requested: str | None, task: str, work: Path = WORK) -> tuple[Path, str]:
    """The checkpoint directory the `transformers` baseline loads (`requested`, or for None/'auto' the
    bundle's exact weights where they can be found: benchmarks/README.md, "Models"), and how it was found."""
    if requested not in (None, "", "auto"):
        path = Path(requested)
        if not (path / "config.json").is_file():
            raise SystemExit(f"checkpoint {path} has no config.json (expected the Hugging Face layout)")
        return path, "given"
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle)
    source = Path(str(manifest.model.get("source_checkpoint", "")))
    if str(source) and (source / "config.json").is_file():
        return source, "bundle source checkpoint"
    compact = ROOT / "defaults" / manifest.name
    if (compact / "compact.json").is_file():
        import hashlib

        from export.defaults import hash_compact
        from model.compact import rebuild

        out = work / "rebuilt" / manifest.name
        # Rebuild whenever the compact default changed (a retrained model), not only when missing.
        digest = hashlib.sha256()
        hash_compact(digest, compact)
        stamp = digest.hexdigest()
        marker = out / ".rebuilt-from"
        if not (out / "config.json").is_file() or not marker.is_file() or marker.read_text() != stamp:
            print(f"rebuilding {manifest.name} from {compact} for the transformers baseline", flush=True)
            rebuild(compact, out)
            marker.write_text(stamp)
        return out, f"rebuilt from defaults/{manifest.name} (the bundle's exact weights)"
    fallback = default_checkpoint(task)
    if (fallback / "config.json").is_file():
        return fallback, "runs/ checkpoint (the bundle may hold a compressed copy of it)"
    raise SystemExit(
        f"cannot find the checkpoint of {bundle}: its source {source} is gone, defaults/{manifest.name} "
        f"does not exist and neither does {fallback}; pass the checkpoint directory explicitly"
    )


def build_dev_models(tasks: Sequence[str], work: Path = WORK) -> dict[str, tuple[Path, Path]]:
    """MiniLM with a random (seeded) head per task: task -> (checkpoint, bundle). Cached in `work`."""
    out: dict[str, tuple[Path, Path]] = {}
    for task in tasks:
        checkpoint = work / "dev-checkpoints" / f"minilm-{task}"
        bundle = work / "dev-bundles" / f"minilm-{task}"
        if not (bundle / "bundle.json").is_file():
            import torch

            from export import export_bundle
            from model.bert import TASK_HEADS
            from model.checkpoint import minilm_package_dir

            torch.manual_seed(0)
            extra = {"id2label": DEV_LABELS[task]} if task in DEV_LABELS else {}
            model = TASK_HEADS[task].from_pretrained(minilm_package_dir(), task=task, **extra)
            model.save_pretrained(checkpoint, tokenizer_from=minilm_package_dir())
            export_bundle(
                checkpoint,
                bundle,
                variants=("fp32", "fused", "int8", "int8-rowwise", "int8-rowwise-avx2"),
                max_seq_len=DEV_MAX_SEQ_LEN[task],
                name=f"minilm-{task}-random-head",
                overwrite=True,
                log=lambda message, task=task: print(f"  [dev {task}] {message}", flush=True),
            )
        out[task] = (checkpoint, bundle)
    return out


def build_tiny_models(root: Path = TINY_MODELS) -> Path:
    """Four tiny random bundles (the test suite's), built once: a smoke run needs no real model."""
    if root.is_dir() and len(list(root.glob("*/bundle.json"))) == 4:
        return root
    from export import export_bundle
    from model.tiny import make_tiny_checkpoint

    for task in ("classify", "ner", "multiple-choice", "qa"):
        checkpoint = make_tiny_checkpoint(task, root.parent / "tiny-checkpoints" / task)
        export_bundle(checkpoint, root / task, max_seq_len=64, name=f"tiny-{task}", overwrite=True)
    return root


def timed(
    fn: Callable[[], Any], runs: int, budget_s: float = math.inf, min_runs: int = 1
) -> tuple[Any, list[float]]:
    """Call `fn` up to `runs` times, stopping after `budget_s` once `min_runs` ran: (last result, seconds)."""
    times: list[float] = []
    result = None
    deadline = time.perf_counter() + budget_s
    while len(times) < runs and (len(times) < min_runs or time.perf_counter() < deadline):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return result, times


def linear_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Least squares y = intercept + slope * x, with R²."""
    n = len(x)
    if n < 2 or len(y) != n:
        raise ValueError(f"a line needs at least 2 matching points, got {len(x)} x and {len(y)} y")
    mean_x, mean_y = sum(x) / n, sum(y) / n
    sxx = sum((a - mean_x) ** 2 for a in x)
    if sxx == 0:
        raise ValueError("all x values are equal: no line fits")
    slope = sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    total = sum((b - mean_y) ** 2 for b in y)
    residual = sum((b - intercept - slope * a) ** 2 for a, b in zip(x, y, strict=True))
    return {"slope": slope, "intercept": intercept, "r2": 1.0 - residual / total if total else 1.0}


def power_law_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """k in y ~ x^k from a log-log fit: 1 means linear growth, 2 quadratic."""
    return linear_fit([math.log(a) for a in x], [math.log(b) for b in y])["slope"]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command(module: str, argv: Sequence[str] | None = None) -> str:
    """The command that made a result: `python -m benchmarks.<module>` and its arguments."""
    from benchmarks import cpu_mask  # run under it, the line names it

    args = sys.argv[1:] if argv is None else argv
    return repo_relative(shlex.join([*cpu_mask.wrapper(), "python", "-m", f"benchmarks.{module}", *args]))


def repo_relative(text: str) -> str:
    """Results hold commands others can run: `python`, paths relative to the repository."""
    text = text.replace(sys.executable, "python")
    text = text.replace(f"{ROOT}/", "").replace(str(ROOT), ".")
    return text.replace(f"{ROOT.parent / 'shared'}/", "../shared/")


def write_results(
    out_dir: Path, stem: str, report: dict[str, Any], markdown: str, plot: Callable[[Path], None] | None
) -> list[Path]:
    """stem.json, stem.md and (when `plot` is given) stem.png in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(repo_relative(json.dumps(report, indent=2, default=float)) + "\n", encoding="utf-8")
    paths[1].write_text(repo_relative(markdown.rstrip()) + "\n", encoding="utf-8")
    if plot is not None:
        paths.append(out_dir / f"{stem}.png")
        plot(paths[-1])
    print("wrote " + ", ".join(str(p) for p in paths), flush=True)
    return paths


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def cpu_label(machine: dict[str, Any]) -> str:
    """The CPU's name, with its vector extensions where the results recorded them."""
    isa = machine.get("isa")
    return f"{machine.get('cpu')}" + (f" ({', '.join(isa) or 'no AVX2'})" if isa is not None else "")


def machine_line(machine: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in machine.get("versions", {}).items())
    return (
        f"{cpu_label(machine)}, {machine.get('logical_cores')} logical cores, "
        f"{machine.get('memory_gib', '?')} GiB RAM, "
        f"load average at start {machine.get('load_average_at_start')}; "
        f"{machine.get('os')}, Python {machine.get('python')}; {versions}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants."""
    import psutil

    process = psutil.Process(pid)
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        with suppress(psutil.NoSuchProcess):  # exited since the list was taken
            times = p.cpu_times()
            total += times.user + times.system
    return total


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process's main thread: for our server, the event loop (HTTP,
    validation, tokenizing, batching). The rest of its process tree's time is in other threads
    (for us inference, whose threads outlive the run; threads that ended still count there)."""
    import psutil

    return sum(t.user_time + t.system_time for t in psutil.Process(pid).threads() if t.id == pid)


def tree_rss_mb(pid: int) -> float:
    import psutil

    process = psutil.Process(pid)
    return round(sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20, 1)


@contextmanager
def server(
    command: list[str],
    env: dict[str, str],
    log_path: Path,
    url: str,
    ready_timeout: float,
    outcome: dict[str, Any] | None = None,
    ready_path: str = "/ready",
) -> Iterator[int]:
    """Start a server process, wait until GET ready_path answers 200 (failing at once if it exits or
    reports a failed load), yield its pid; SIGTERM (then kill) on exit, with its exit status in
    `outcome["exit_code"]`."""
    import httpx

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env={**os.environ, **env}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline, problem = time.monotonic() + ready_timeout, None
            while problem is None:
                try:
                    response = httpx.get(f"{url}{ready_path}", timeout=5)
                    if response.status_code == 200:
                        break
                    if response.headers.get("content-type", "").startswith("application/json"):
                        if response.json().get("status") == "failed":
                            problem = f"reports a failed load: {response.text[:500]}"
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    problem = f"exited with status {proc.returncode}"
                elif time.monotonic() > deadline:
                    problem = f"was not ready after {ready_timeout:.0f}s"
                time.sleep(0.25)
            if problem is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise SystemExit(f"server at {url} {problem}; end of {log_path}:\n{tail}")
            yield proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if outcome is not None:
                outcome["exit_code"] = proc.returncode


def uvicorn_command(port: int, tree: Path = ROOT) -> list[str]:
    """`uvicorn app.main:app` on loopback, with the connection layer where `tree`'s code has one (as
    `python -m app` and deploy/entrypoint.sh run it; an older revision's tree has none)."""
    command = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)]
    if (tree / "app" / "api" / "connections.py").exists():
        command += ["--http", "app.api.connections:GuardedHttp", "--no-server-header"]
    return command


def serve_ours(
    models_dir: Path,
    log_path: Path,
    ready_timeout: float = 300,
    outcome: dict[str, Any] | None = None,
    workers: int = 1,
    **env: str,
) -> tuple[str, Any]:
    """Our service (`uvicorn app.main:app`, `workers` processes) on MODELS_DIR=models_dir and a free loopback
    port, with other settings as environment variables: (its URL, the `server` context that runs it)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = uvicorn_command(port)
    command += ["--workers", str(workers)] if workers > 1 else []
    env = {"MODELS_DIR": str(models_dir), "LOG_LEVEL": "WARNING", **env}
    return url, server(command, env, log_path, url, ready_timeout, outcome)
