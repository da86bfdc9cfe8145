"""The peers' own virtual environments, made on first use under .cache/peers/<name>/venv.

Their pins conflict with ours and with each other, so each gets its own interpreter; torch (where a
peer needs it) is installed first from pip's configured find-links, as any other torch pulls the
CUDA wheels. A finished environment holds `requirements.txt`; another list rebuilds it.

    python -m benchmarks.peer_envs infinity     # make (or reuse) one environment
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_common import ROOT

PEERS_DIR = ROOT / ".cache" / "peers"
TORCH = "torch==2.13.0"
INFINITY_EXTRAS = "server,torch,optimum"
INFINITY_PINS = ["optimum[onnxruntime]==1.27.0", "transformers==4.48.3", "click<8.2"]
# name -> (needs torch, its packages). Infinity as the issue measured it; the rest current.
ENVS: dict[str, tuple[bool, list[str]]] = {
    # infinity 0.0.77 imports optimum.bettertransformer: gone in optimum 2, refused by transformers
    # >= 4.49; its typer 0.12 fails on click >= 8.2.
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
    code = (
        "import json, sys\nfrom importlib import metadata\nout = {}\n"
        "for p in sys.argv[1:]:\n    try: out[p] = metadata.version(p)\n"
        "    except metadata.PackageNotFoundError: pass\nprint(json.dumps(out))"
    )
    python = venv_dir(name) / "bin" / "python"
    done = subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(ENVS):
        print(ensure(arg))
