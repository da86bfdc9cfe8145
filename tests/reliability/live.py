"""A real `uvicorn app.main:app` subprocess on loopback: start, wait for readiness, RSS, logs, stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.bench_common import free_port, uvicorn_command  # free_port: re-exported for the tests
from benchmarks.nofile import under_nofile

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LiveServer:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        return psutil.Process(self.process.pid).memory_info().rss / 2**20

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]

    def wait_ready(self, timeout_s: float = 60.0, expect: int = 200) -> httpx.Response:
        """Poll /ready until it answers `expect` (or the load failed); fail if the process dies."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process.poll() is None, f"server exited early:\n{self.log_text()[-3000:]}"
            try:
                response = httpx.get(f"{self.url}/ready", timeout=5)
                if response.status_code == expect or response.json().get("status") == "failed":
                    return response
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (
                f"server not ready in {timeout_s}s:\n{self.log_text()[-3000:]}"
            )
            time.sleep(0.1)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(models_dir: Path, log_dir: Path, nofile: int | None = None, **env: str) -> LiveServer:
    """Start uvicorn on a free port with MODELS_DIR and extra settings (env names, e.g. MAX_QUEUE="8");
    `nofile`: the process's open-file limit (`ulimit -n`)."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{port}.log"
    full_env = {
        **os.environ,
        "MODELS_DIR": str(models_dir),
        "DEVICE": "cpu",
        "LOG_LEVEL": "WARNING",
        "INTRA_OP_THREADS": "1",
        **env,
    }
    with log_path.open("w") as log:
        command = uvicorn_command(port)  # on the connection layer (UVICORN_ARGS), as python -m app runs it
        process = subprocess.Popen(
            under_nofile(command, nofile),
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return LiveServer(process, port, log_path)
