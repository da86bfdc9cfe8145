"""deploy/docker-compose.yml itself, run as containers with podman-compose: 3 replicas of the built
image behind nginx, with Prometheus. The same Python API as deploy/local/stack.py's LocalStack, so
benchmarks/faults.py injects its faults into either (`--stack compose`).

    python deploy/podman/stack.py up      # then: curl localhost:8080/ready; Prometheus on :9090
    python deploy/podman/stack.py down

Needs the image (deploy/podman/build.sh) and, where no registry can be reached, the nginx and
Prometheus stand-ins (deploy/podman/standins.sh nginx prometheus), named by NGINX_IMAGE and
PROMETHEUS_IMAGE as the compose file reads them. podman's settings: deploy/podman/containers.conf.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
CONTAINERS_CONF = ROOT / "deploy" / "podman" / "containers.conf"
STANDINS = {
    "NGINX_IMAGE": "localhost/nginx-standin:latest",
    "PROMETHEUS_IMAGE": "localhost/prometheus-standin:latest",
}
READY = (
    "import sys, urllib.request; "
    "sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2).status != 200)"
)


def podman_env() -> dict[str, str]:
    """This environment with podman's settings for these machines (CONTAINERS_CONF, unless set)."""
    return {"CONTAINERS_CONF": str(CONTAINERS_CONF), **os.environ}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, check=check, timeout=timeout
    )


def podman_compose() -> list[str]:
    found = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
    return [found]


class ComposeStack:
    """Start, signal, restart and stop the containers of one compose project."""

    def __init__(
        self,
        project: str = "bert-serving",
        replicas: int = 3,
        http_port: int = 8080,
        prometheus_port: int = 9090,
        ready_timeout_s: float = 600.0,
    ):
        self.project, self.replica_count = project, replicas
        self.http_port, self.prometheus_port = http_port, prometheus_port
        self.ready_timeout_s = ready_timeout_s
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"{project}-"))  # every container's log, kept at stop
        self.env = {
            **podman_env(),
            "HTTP_PORT": str(http_port),
            "PROMETHEUS_PORT": str(prometheus_port),
        }
        for name, standin in STANDINS.items():
            self.env.setdefault(name, standin)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def replicas(self) -> list[int]:
        return list(range(1, self.replica_count + 1))

    def expected_targets(self) -> set[str]:
        """The instances Prometheus should scrape: every replica's current address on the network."""
        template = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        found = podman("inspect", "--format", template, *map(self.container, self.replicas))
        return {f"{address}:8000" for address in found.stdout.split()}

    def container(self, index: int) -> str:
        return f"{self.project}_api_{index}"

    def compose(self, *args: str, timeout: float = 600) -> None:
        command = [*podman_compose(), "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    # ------------------------------------------------------------------ replicas
    def running(self, index: int) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.container(index), check=False)
        return state.stdout.strip() == "true"

    def start_replica(self, index: int) -> None:
        """Start it again, unless the restart policy already has."""
        if not self.running(index):
            podman("start", self.container(index))

    def wait_replica_ready(self, index: int, timeout_s: float | None = None) -> float:
        """/ready from inside the container (the host reaches it only through nginx); seconds waited."""
        started = time.monotonic()
        while podman("exec", self.container(index), "python3", "-c", READY, check=False).returncode != 0:
            if time.monotonic() - started > (timeout_s or self.ready_timeout_s):
                raise TimeoutError(f"replica {index} not ready in time:\n{self.log_tail(index)}")
            time.sleep(0.5)
        return time.monotonic() - started

    def signal_replica(self, index: int, sig: signal.Signals) -> None:
        if sig == signal.SIGTERM:  # as `docker compose stop`: SIGTERM, and no restart by the policy
            podman("stop", "--time", "40", self.container(index), timeout=60)
        else:
            podman("kill", "--signal", sig.name, self.container(index))

    def wait_replica_exit(self, index: int, timeout_s: float = 60.0) -> int:
        """Its exit status, once it has exited (a restart policy may start it again right after)."""
        done = podman("wait", self.container(index), timeout=timeout_s, check=False)
        return int(done.stdout.strip() or -1)

    def log_tail(self, index: int, chars: int = 3000) -> str:
        done = podman("logs", self.container(index), check=False)
        return (done.stdout + done.stderr)[-chars:]

    def nginx_log(self) -> str:
        done = podman("logs", f"{self.project}_nginx_1", check=False)
        return done.stdout + done.stderr

    # ------------------------------------------------------------------ the stack
    def start(self) -> None:
        self.stop()  # a clean slate: no container, no volume (old Prometheus data) of an earlier run
        self.compose("up", "-d", "--no-build", "--scale", f"api={self.replica_count}")
        for index in self.replicas:
            self.wait_replica_ready(index)
        for url in (f"{self.url}/ready", f"{self.prometheus_url}/-/ready"):
            wait_http(url, self.ready_timeout_s)

    def save_logs(self) -> None:
        listed = podman(
            "ps",
            "-a",
            "--format",
            "{{.Names}}",
            "--filter",
            f"label=io.podman.compose.project={self.project}",
        )
        for name in listed.stdout.split():
            done = podman("logs", name, check=False)
            (self.run_dir / f"{name}.log").write_text(done.stdout + done.stderr)
        print(f"container logs: {self.run_dir}", file=sys.stderr)

    def stop(self) -> None:
        self.save_logs()
        # podman-compose's `down` forgets replicas made by --scale: those go by the project's label.
        # A container the restart policy is bringing back can refuse one `rm`: try again.
        for _ in range(5):
            leftover = podman("ps", "-aq", "--filter", f"label=io.podman.compose.project={self.project}")
            if not (ids := leftover.stdout.split()):
                break
            podman("rm", "-f", "-t", "40", *ids, check=False, timeout=120)
            time.sleep(1)
        else:
            print(f"warning: containers of {self.project} left behind: {' '.join(ids)}", file=sys.stderr)
        self.compose("down", "-v", "-t", "40")


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 in {timeout_s:.0f}s")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--http-port", type=int, default=8080)
    parser.add_argument("--prometheus-port", type=int, default=9090)
    args = parser.parse_args(argv)
    stack = ComposeStack(
        replicas=args.replicas, http_port=args.http_port, prometheus_port=args.prometheus_port
    )
    if args.action == "up":
        stack.start()
        print(f"ready: {stack.url} (nginx -> {args.replicas} replicas), Prometheus {stack.prometheus_url}")
    else:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
