"""The docker-compose topology on this machine, without Docker: N replicas of the service, nginx in
front of them with deploy/nginx/nginx.conf, and Prometheus with deploy/prometheus/prometheus.yml.

    python deploy/local/stack.py up [--replicas 3] [--models-dir .cache/bundles]   (make local-up)
    python deploy/local/stack.py down                                             (make local-down)

The configurations are the compose files' own, rendered for loopback: only what Docker's network
would otherwise provide changes (replica addresses instead of the `api-replicas` DNS name, ports,
and pid/log/temp paths under the run directory so nothing needs root). Each rendering step must
match exactly once, so a configuration that drifts from what the renderer knows fails loudly. The
replicas get the compose file's environment (`x-api-env`) with one single-threaded model instance
each, so three fit on two cores. Processes run in their own sessions and their pids are kept in
the run directory; `down` signals only those pids, after checking each is still the process started.
"""

from __future__ import annotations

import argparse
import copy
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NGINX_CONF = DEPLOY / "nginx" / "nginx.conf"
PROMETHEUS_DIR = DEPLOY / "prometheus"
COMPOSE = DEPLOY / "docker-compose.yml"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
DEFAULT_RUN_DIR = ROOT / ".cache" / "local-stack"
SYSTEM_PATHS = ("/usr/sbin", "/sbin", "/usr/bin", "/usr/local/bin")
# Per replica: one single-threaded session per model, so three replicas of four models share two cores.
REPLICA_ENV = {"MODEL_INSTANCES": "1", "INTRA_OP_THREADS": "1"}


def find_tool(name: str) -> str | None:
    """A system tool, also where root's PATH would have it (nginx lives in /usr/sbin)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_PATHS]))


def _replace(text: str, pattern: str, replacement: Any, what: str, at_least_one: bool = False) -> str:
    """re.sub that must match exactly once (or at least once): a config that drifted fails here."""
    new, count = re.subn(pattern, replacement, text, flags=re.M)
    if count != 1 and not (at_least_one and count > 1):
        raise ValueError(f"nginx.conf: expected exactly one {what} ({pattern!r}), found {count}")
    return new


def render_nginx(conf: str, replica_ports: list[int], http_port: int, run_dir: Path) -> str:
    """deploy/nginx/nginx.conf with loopback replicas and ports, and every path under run_dir."""
    run = run_dir.resolve()

    def servers(match: re.Match[str]) -> str:
        indent, params = match.group(1), match.group(2).strip()
        return "\n".join(f"{indent}server 127.0.0.1:{port} {params};".rstrip() for port in replica_ports)

    conf = _replace(conf, r"^pid\s+\S+;", f"pid {run}/nginx.pid;", "pid")
    conf = _replace(conf, r"^\s*resolver\s[^;]*;\n", "", "resolver")  # Docker DNS only
    conf = _replace(conf, r"^\s*resolver_timeout\s[^;]*;\n", "", "resolver_timeout")
    conf = _replace(
        conf, r"^(\s*)server\s+api-replicas:\d+\s+resolve\b([^;]*);", servers, "upstream", at_least_one=True
    )
    conf = _replace(conf, r"^(\s*)listen\s+80;", rf"\1listen 127.0.0.1:{http_port};", "listen 80")
    conf = _replace(
        conf, r"^(\s*)access_log\s+/dev/stdout\s+(\w+);", rf"\1access_log {run}/nginx-access.log \2;", "log"
    )
    conf = _replace(
        conf, r"^(\s*)error_log\s+/dev/stderr\s+(\w+);", rf"\1error_log {run}/nginx-error.log \2;", "log"
    )
    temp = "".join(
        f"    {kind}_temp_path {run}/nginx-temp/{kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = _replace(conf, r"^http\s*\{\n", lambda m: m.group(0) + temp, "http block")
    if os.geteuid() == 0:  # workers would run as nobody, who cannot reach a private run_dir
        conf = f"user {pwd.getpwuid(0).pw_name};\n" + conf
    return conf


def render_prometheus(
    config: dict[str, Any], replica_ports: list[int], prometheus_port: int
) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with the replicas as static targets instead of Docker DNS."""
    config = copy.deepcopy(config)
    discovered = [job for job in config["scrape_configs"] if "dns_sd_configs" in job]
    if len(discovered) != 1:
        raise ValueError(f"prometheus.yml: expected one job with dns_sd_configs, found {len(discovered)}")
    (job,) = discovered
    del job["dns_sd_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{port}" for port in replica_ports]}]
    for other in config["scrape_configs"]:
        for static in other.get("static_configs", []) if other is not job else []:
            static["targets"] = [
                re.sub(r"^localhost:9090$", f"127.0.0.1:{prometheus_port}", t) for t in static["targets"]
            ]
    # Rule files are named relative to the configuration; point at the repository's copies.
    config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config.get("rule_files", [])]
    return config


def compose_api_env() -> dict[str, str]:
    """The compose file's replica environment (x-api-env), `${VAR:-default}` read as its default."""
    env = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["x-api-env"]
    return {k: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(v)) for k, v in env.items()}


@dataclass
class StackConfig:
    models_dir: Path
    run_dir: Path = DEFAULT_RUN_DIR
    replica_ports: list[int] = field(default_factory=lambda: [8001, 8002, 8003])
    http_port: int = 8080
    prometheus_port: int | None = 9090  # None: no Prometheus
    env: dict[str, str] = field(default_factory=dict)  # extra replica settings
    nginx_conf: Path = NGINX_CONF  # another nginx.conf to render (e.g. an older one, to compare)
    ready_timeout_s: float = 180.0


class LocalStack:
    """Start, signal, restart and stop the processes of one stack (the Python API under `up`)."""

    def __init__(self, config: StackConfig):
        self.config = config
        self.run_dir = config.run_dir.resolve()
        self.replicas: dict[int, subprocess.Popen] = {}
        self.nginx: subprocess.Popen | None = None
        self.prometheus: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.http_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.config.prometheus_port}"

    def expected_targets(self) -> set[str]:
        """The instances Prometheus should scrape: every replica."""
        return {f"127.0.0.1:{port}" for port in self.config.replica_ports}

    def replica_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.config.replica_ports[index]}"

    # ------------------------------------------------------------------ files
    def write_configs(self) -> tuple[Path, Path | None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "pids").mkdir(exist_ok=True)
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.run_dir / "nginx-temp" / kind).mkdir(parents=True, exist_ok=True)
        cfg = self.config
        nginx_conf = self.run_dir / "nginx.conf"
        nginx_conf.write_text(
            render_nginx(cfg.nginx_conf.read_text(), cfg.replica_ports, cfg.http_port, self.run_dir)
        )
        if cfg.prometheus_port is None:
            return nginx_conf, None
        prometheus_yml = self.run_dir / "prometheus.yml"
        source = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
        rendered = render_prometheus(source, cfg.replica_ports, cfg.prometheus_port)
        prometheus_yml.write_text(yaml.safe_dump(rendered, sort_keys=False))
        return nginx_conf, prometheus_yml

    def nginx_command(self, *extra: str) -> list[str]:
        nginx = find_tool("nginx")
        if nginx is None:
            raise FileNotFoundError("nginx is not installed (apt-get install nginx)")
        conf, error_log = self.run_dir / "nginx.conf", self.run_dir / "nginx-error.log"
        return [nginx, "-p", str(self.run_dir), "-c", str(conf), "-e", str(error_log), *extra]

    def prometheus_command(self, config: Path) -> list[str]:
        prometheus = find_tool("prometheus")
        if prometheus is None:
            raise FileNotFoundError("prometheus is not installed (apt-get install prometheus)")
        return [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.run_dir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.config.prometheus_port}",
            "--log.level=warn",
        ]

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.run_dir / f"{name}.log").open("ab")  # appended: a restarted replica keeps its history
        with log:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal does not reach the stack
            )
        (self.run_dir / "pids" / f"{name}.pid").write_text(f"{process.pid}\n")
        return process

    def replica_env(self, index: int) -> dict[str, str]:
        python_bin = str(Path(sys.executable).parent)  # the entrypoint finds this environment's uvicorn
        return {
            **compose_api_env(),
            "DEVICE": "cpu",
            **REPLICA_ENV,
            **self.config.env,
            "MODELS_DIR": str(Path(self.config.models_dir).resolve()),
            "HOST": "127.0.0.1",
            "PORT": str(self.config.replica_ports[index]),
            "PATH": f"{python_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def start_replica(self, index: int) -> subprocess.Popen:
        process = self._spawn(f"replica-{index}", ["bash", str(ENTRYPOINT)], self.replica_env(index))
        self.replicas[index] = process
        return process

    def wait_replica_ready(self, index: int, timeout_s: float | None = None) -> float:
        """Poll the replica's /ready until 200; seconds waited. Fails if the process exits."""
        import httpx

        started = time.monotonic()
        deadline = started + (timeout_s or self.config.ready_timeout_s)
        process = self.replicas[index]
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"replica {index} exited ({process.returncode}):\n{self.log_tail(index)}")
            try:
                if httpx.get(f"{self.replica_url(index)}/ready", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {index} not ready in time:\n{self.log_tail(index)}")
            time.sleep(0.1)

    def signal_replica(self, index: int, sig: signal.Signals) -> None:
        self.replicas[index].send_signal(sig)

    def wait_replica_exit(self, index: int, timeout_s: float = 60.0) -> int:
        return self.replicas[index].wait(timeout=timeout_s)

    def log_tail(self, index: int, chars: int = 3000) -> str:
        return (self.run_dir / f"replica-{index}.log").read_text(errors="replace")[-chars:]

    def nginx_log(self) -> str:
        log = self.run_dir / "nginx-access.log"
        return log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""

    def start(self) -> None:
        """Replicas first (ready), then nginx (checked with nginx -t), then Prometheus."""
        nginx_conf, prometheus_yml = self.write_configs()
        check = subprocess.run(self.nginx_command("-t", "-q"), capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t refused {nginx_conf}:\n{check.stderr}")
        try:
            for index in range(len(self.config.replica_ports)):
                self.start_replica(index)
            for index in range(len(self.config.replica_ports)):
                self.wait_replica_ready(index)
            self.nginx = self._spawn("nginx", self.nginx_command("-g", "daemon off;"))
            if prometheus_yml is not None:
                self.prometheus = self._spawn("prometheus", self.prometheus_command(prometheus_yml))
            self.wait_http(f"{self.url}/nginx-health", self.nginx, "nginx")
            if self.prometheus is not None:
                self.wait_http(f"{self.prometheus_url}/-/ready", self.prometheus, "prometheus")
        except BaseException:
            self.stop()
            raise

    def wait_http(self, url: str, process: subprocess.Popen, name: str, timeout_s: float = 30.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log = (self.run_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited ({process.returncode}):\n{log}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{name} did not answer {url} within {timeout_s:.0f}s")

    def stop(self, timeout_s: float = 40.0) -> None:
        processes = [self.nginx, self.prometheus, *self.replicas.values()]
        for process in processes:
            if process is not None and process.poll() is None:
                process.terminate()
        for process in processes:
            if process is None:
                continue
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid_file in (self.run_dir / "pids").glob("*.pid"):
            pid_file.unlink()


# ---------------------------------------------------------------------- down: by pid files
EXPECTED_COMMAND = {"nginx": "nginx", "prometheus": "prometheus", "replica": "uvicorn"}


def _is_ours(pid: int, name: str) -> bool:
    """The pid still runs the program we started (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return EXPECTED_COMMAND[name.split("-")[0]] in cmdline


def down(run_dir: Path, timeout_s: float = 40.0) -> list[str]:
    """SIGTERM every process listed in run_dir/pids (nginx and Prometheus first), SIGKILL after timeout_s."""
    pid_files = sorted((run_dir / "pids").glob("*.pid"), key=lambda p: p.stem.startswith("replica"))
    stopped = []
    for pid_file in pid_files:
        pid = int(pid_file.read_text())
        if _is_ours(pid, pid_file.stem):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while _is_ours(pid, pid_file.stem) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _is_ours(pid, pid_file.stem):
                os.kill(pid, signal.SIGKILL)
            stopped.append(f"{pid_file.stem} ({pid})")
        pid_file.unlink()
    return stopped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("up", "down"))
    p.add_argument("--models-dir", type=Path, default=Path(os.environ.get("MODELS_DIR", ".cache/bundles")))
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--first-replica-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8080)))
    p.add_argument("--prometheus-port", type=int, default=int(os.environ.get("PROMETHEUS_PORT", 9090)))
    p.add_argument("--no-prometheus", action="store_true")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra replica setting")
    args = p.parse_args(argv)
    if args.action == "down":
        stopped = down(args.run_dir)
        print("stopped " + (", ".join(stopped) if stopped else "nothing (no stack running)"))
        return 0
    if any(_is_ours(int(f.read_text()), f.stem) for f in (args.run_dir / "pids").glob("*.pid")):
        p.error(f"a stack is already running from {args.run_dir}; run `down` first")
    prometheus = not args.no_prometheus
    if prometheus and find_tool("prometheus") is None:
        print("prometheus is not installed (apt-get install prometheus): starting without it")
        prometheus = False
    config = StackConfig(
        models_dir=args.models_dir,
        run_dir=args.run_dir,
        replica_ports=[args.first_replica_port + i for i in range(args.replicas)],
        http_port=args.http_port,
        prometheus_port=args.prometheus_port if prometheus else None,
        env=dict(item.split("=", 1) for item in args.env),
    )
    stack = LocalStack(config)
    stack.start()
    ports = ", ".join(str(port) for port in config.replica_ports)
    print(f"{args.replicas} replicas on 127.0.0.1:{{{ports}}}, nginx on {stack.url}", end="")
    print(f", Prometheus on {stack.prometheus_url}" if prometheus else "")
    print(f"logs and pids in {stack.run_dir}; stop with: python deploy/local/stack.py down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
