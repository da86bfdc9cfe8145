"""deploy/entrypoint.sh, run directly: dry-run commands, validation, pass-through, healthcheck."""

from __future__ import annotations

import http.server
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.deploy.files import ENTRYPOINT

SERVER_VARS = (
    "MODELS_DIR",
    "HOST",
    "PORT",
    "WORKERS",
    "LOG_LEVEL",
    "DRY_RUN",
    "SHUTDOWN_GRACE_S",
    "API_SERVERS",
)


def run_entrypoint(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in SERVER_VARS}
    # python3 on PATH is this interpreter's (the healthcheck uses it).
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args], env={**base, **env}, capture_output=True, text=True, timeout=30
    )


def dry_run(*args: str, **env: str) -> list[str]:
    result = run_entrypoint("--dry-run", *args, **env)
    assert result.returncode == 0, result.stderr
    return shlex.split(result.stdout)


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_syntax():
    assert subprocess.run(["bash", "-n", str(ENTRYPOINT)]).returncode == 0
    assert os.access(ENTRYPOINT, os.X_OK), "the Dockerfile copies it with --chmod, but keep it executable"


def test_dry_run_uses_the_settings(tmp_path):
    command = dry_run(MODELS_DIR=str(tmp_path), HOST="127.0.0.1", PORT="9123", WORKERS="3", LOG_LEVEL="DEBUG")
    assert command[0] == f"MODELS_DIR={tmp_path}"
    app_at = command.index("app.main:app")
    assert command[1:app_at] in (["uvicorn"], ["python3", "-m", "uvicorn"])
    assert option(command, "--host") == "127.0.0.1"
    assert option(command, "--port") == "9123"
    assert option(command, "--workers") == "3"
    assert option(command, "--log-level") == "debug"  # uvicorn wants lower case, the app takes any


def test_defaults(tmp_path):
    """One worker: python -m app (app/serve.py), which honours API_SERVERS (one process, or front ends
    over one engine) and puts uvicorn on the connection layer itself."""
    command = dry_run(MODELS_DIR=str(tmp_path))
    assert command[1:4] == ["python3", "-m", "app"] and "--workers" not in command
    assert (option(command, "--host"), option(command, "--port")) == ("0.0.0.0", "8000")
    assert option(command, "--log-level") == "info"
    assert dry_run(MODELS_DIR=str(tmp_path), API_SERVERS="3")[1:4] == ["python3", "-m", "app"]
    workers = dry_run(MODELS_DIR=str(tmp_path), WORKERS="2")
    assert option(workers, "--http") == "app.api.connections:GuardedHttp"  # uvicorn's own workers


def test_workers_and_api_servers_do_not_combine(tmp_path):
    result = run_entrypoint("--dry-run", MODELS_DIR=str(tmp_path), WORKERS="2", API_SERVERS="2")
    assert result.returncode == 64 and "do not combine" in result.stderr and result.stdout == ""


@pytest.mark.parametrize(("grace", "seconds"), [(None, "30"), ("10", "10"), ("12.5", "13"), ("0", "0")])
def test_uvicorn_drains_for_the_apps_shutdown_grace(tmp_path, grace, seconds):
    """One setting bounds the drain: uvicorn's graceful shutdown is SHUTDOWN_GRACE_S (rounded up),
    whose default is the app's own."""
    env = {"MODELS_DIR": str(tmp_path)} | ({"SHUTDOWN_GRACE_S": grace} if grace is not None else {})
    assert option(dry_run(**env), "--timeout-graceful-shutdown") == seconds
    from app.settings import Settings

    assert Settings.model_fields["shutdown_grace_s"].default == 30


def test_default_models_dir_is_documented_mount():
    result = run_entrypoint("--dry-run")
    if Path("/models").is_dir():
        assert shlex.split(result.stdout)[0] == "MODELS_DIR=/models"
    else:
        assert result.returncode == 64 and "MODELS_DIR '/models'" in result.stderr


def test_extra_arguments_pass_through(tmp_path):
    command = dry_run("--limit-concurrency", "100", MODELS_DIR=str(tmp_path))
    assert command[-2:] == ["--limit-concurrency", "100"]
    # `serve` with DRY_RUN=1 is the same thing.
    result = run_entrypoint("serve", "--limit-concurrency", "100", MODELS_DIR=str(tmp_path), DRY_RUN="1")
    assert shlex.split(result.stdout) == command


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PORT": "eighty"}, "PORT"),
        ({"PORT": "70000"}, "PORT"),
        ({"WORKERS": "0"}, "WORKERS"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
        ({"SHUTDOWN_GRACE_S": "soon"}, "SHUTDOWN_GRACE_S"),
        ({"MODELS_DIR": "/definitely/not/here"}, "MODELS_DIR '/definitely/not/here'"),
    ],
)
def test_bad_settings_fail_clearly(tmp_path, env, message):
    result = run_entrypoint("--dry-run", **{"MODELS_DIR": str(tmp_path), **env})
    assert result.returncode == 64
    assert message in result.stderr and result.stdout == ""


def test_other_commands_run_instead():
    result = run_entrypoint("echo", "hello")
    assert result.returncode == 0 and result.stdout == "hello\n"


class HealthHandler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    HealthHandler.status = 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HealthHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_healthcheck_follows_health(health_server):
    port = str(health_server.server_address[1])
    HealthHandler.status = 200
    # A wildcard bind address is checked on loopback.
    assert run_entrypoint("healthcheck", HOST="0.0.0.0", PORT=port).returncode == 0
    HealthHandler.status = 500
    result = run_entrypoint("healthcheck", PORT=port)
    assert result.returncode == 1 and "500" in result.stderr


def test_healthcheck_fails_when_nothing_listens(health_server):
    port = str(health_server.server_address[1])
    health_server.shutdown()
    health_server.server_close()
    assert run_entrypoint("healthcheck", PORT=port).returncode == 1
