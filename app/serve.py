"""The one command that serves (`make serve` and the image run it): `python -m app [--host H] [--port P]
[UVICORN_OPTION ...]` (other options go to uvicorn: --log-level, --timeout-graceful-shutdown, ...).

API_SERVERS=1 (the default): the whole service in one process, `uvicorn app.main:app`.
API_SERVERS=N > 1: one engine process (app/engine/process.py: models, batchers, sessions) and N
front-end processes (HTTP, protocols, tokenizing, the response cache) sharing the listening socket,
under this supervisor:
  - a front end that exits is started again (its in-flight requests are lost, the others' are not);
  - if the engine exits, the front ends are stopped and this process exits 1, for the orchestrator
    (systemd, Kubernetes, compose) to restart the service: the models live in the engine, so no
    front end could answer anyway, and a restart reloads them from MODELS_DIR;
  - SIGTERM or SIGINT: the front ends drain their in-flight requests (SHUTDOWN_GRACE_S) and exit,
    then the engine drains its batchers; exit 0.
Metrics are prometheus_client's multiprocess files in a private directory: any front end's
/metrics adds up every process's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.api.connections import UVICORN_ARGS
from app.main import ENGINE_SOCKET_ENV
from app.settings import Settings

POLL_S = 0.1


class Supervisor:
    def __init__(self, servers: int, host: str, port: int, grace_s: float, options: list[str] = ()):
        self.servers, self.host, self.port, self.grace_s = servers, host, port, grace_s
        self.options = list(options)  # uvicorn's, for every front end
        self.stopping = False
        self.work = Path(tempfile.mkdtemp(prefix="bert-serve-"))
        self.socket_path = str(self.work / "engine.sock")
        metrics_dir = self.work / "metrics"
        metrics_dir.mkdir()
        self.env = {
            **os.environ,
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            ENGINE_SOCKET_ENV: self.socket_path,
        }
        self.listener: socket.socket | None = None
        self.engine: subprocess.Popen | None = None
        self.front_ends: list[subprocess.Popen] = []

    def _front_end(self) -> subprocess.Popen:
        assert self.listener is not None
        fd = self.listener.fileno()
        command = uvicorn(["--fd", str(fd)], self.options)
        # Sessions of their own: a terminal's Ctrl-C reaches this supervisor only, which stops the
        # processes in order (the engine last, so the front ends' requests drain).
        return subprocess.Popen(command, env=self.env, pass_fds=(fd,), start_new_session=True)

    def _stop(self, *_: object) -> None:
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        env = {k: v for k, v in self.env.items() if k != ENGINE_SOCKET_ENV}
        self.engine = subprocess.Popen(
            [sys.executable, "-m", "app.engine.process", self.socket_path], env=env, start_new_session=True
        )
        while not os.path.exists(self.socket_path):
            if self.engine.poll() is not None:
                return self._exit(1, "the engine process exited before it listened")
            if self.stopping:
                return self._exit(0)
            time.sleep(POLL_S)
        self.listener = socket.create_server((self.host, self.port), backlog=2048, reuse_port=False)
        self.listener.set_inheritable(True)
        self.front_ends = [self._front_end() for _ in range(self.servers)]
        print(
            f"serving on http://{self.host}:{self.port}: {self.servers} front ends "
            f"{[p.pid for p in self.front_ends]}, engine {self.engine.pid}",
            file=sys.stderr,
            flush=True,
        )
        while not self.stopping:
            time.sleep(POLL_S)
            if self.engine.poll() is not None:
                return self._exit(1, f"the engine process exited ({self.engine.returncode})")
            for index, proc in enumerate(self.front_ends):
                if proc.poll() is not None and not self.stopping:
                    self._forget(proc.pid)
                    self.front_ends[index] = self._front_end()
                    print(
                        f"front end {proc.pid} exited ({proc.returncode}); "
                        f"started {self.front_ends[index].pid}",
                        file=sys.stderr,
                        flush=True,
                    )
        return self._exit(0)

    def _forget(self, pid: int) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self.env["PROMETHEUS_MULTIPROC_DIR"])

    def _exit(self, code: int, reason: str = "") -> int:
        if reason:
            print(reason, file=sys.stderr, flush=True)
        # Front ends first (they drain their requests, which need the engine), then the engine.
        for proc in self.front_ends:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.front_ends:
            _wait(proc, self.grace_s + 15)
        if self.listener is not None:
            self.listener.close()
        if self.engine is not None and self.engine.poll() is None:
            self.engine.send_signal(signal.SIGTERM)
            _wait(self.engine, self.grace_s + 15)
        shutil.rmtree(self.work, ignore_errors=True)
        return code


def _wait(proc: subprocess.Popen, timeout_s: float) -> None:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def uvicorn(bind: list[str], options: list[str]) -> list[str]:
    """uvicorn serving the app on `bind`, on the connection layer, with the caller's other options."""
    return [sys.executable, "-m", "uvicorn", "app.main:app", *bind, *UVICORN_ARGS, *options]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    parser.add_argument("--host", default=os.environ.get("HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    args, options = parser.parse_known_args(argv)
    os.environ.setdefault("GRPC_HOST", args.host)  # GRPC_PORT listens where HTTP does, unless told otherwise
    settings = Settings()
    if settings.api_servers <= 1:
        command = uvicorn(["--host", args.host, "--port", str(args.port)], options)
        os.execv(sys.executable, command)
    if "--workers" in options or "--fd" in options or "--uds" in options:
        parser.error("API_SERVERS > 1 runs its own front ends on one socket: no --workers, --fd or --uds")
    return Supervisor(settings.api_servers, args.host, args.port, settings.shutdown_grace_s, options).run()
