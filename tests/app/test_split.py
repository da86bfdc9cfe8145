"""One engine, many front ends (API_SERVERS, app/serve.py), as real processes on the tiny bundles:
the same answers as one process, bit for bit; metrics counted once across processes; a live swap
under load that loses nothing and never answers from the old version after its acknowledgement;
a killed front end losing exactly the requests on its own connections, restarted while the others
serve; a killed engine ending the service with status 1 (the documented choice); SIGTERM draining
every process to exit 0; gRPC (GRPC_PORT) served by every front end on the one port."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from benchmarks.bench_common import free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN = {"Authorization": "Bearer split-admin"}
REQUESTS = [
    ("/classify", {"text": "a fine and moving film", "model": "classify"}),
    (
        "/classify",
        {"inputs": [{"text": "dull"}, {"text": "bright", "text_pair": "and warm"}], "model": "classify"},
    ),
    ("/ner", {"text": "Ada Lovelace met Charles Babbage in London in 1833."}),
    ("/multiple-choice", {"context": "It rained all day.", "choices": ["wet", "dry", "sunny"]}),
    ("/qa", {"question": "Where did she live?", "context": "Ada lived in London with her mother. " * 30}),
    ("/embed", {"inputs": ["one short text", "another, rather longer text " * 40]}),
    ("/v1/embeddings", {"input": ["hello there"], "model": "embed"}),
    ("/similarity", {"inputs": {"source_sentence": "a cat", "sentences": ["a dog", "a car"]}}),
    ("/rerank", {"query": "cats", "texts": ["dogs", "cats purr"], "model": "classify"}),
    (
        "/v2/models/classify/infer",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["good", "bad"]}]},
    ),
]


@dataclass
class Service:
    process: subprocess.Popen
    url: str
    log: Path
    grpc: str = ""  # host:port, with GRPC_PORT

    def pids(self) -> tuple[list[int], int]:
        """(front ends, engine) as the supervisor last reported them."""
        text = self.log.read_text(errors="replace")
        found = re.findall(r"front ends \[([\d, ]+)\], engine (\d+)", text)
        fronts = [int(p) for p in found[-1][0].split(",")]
        for old, new in re.findall(r"front end (\d+) exited .*?started (\d+)", text, re.S):
            fronts = [int(new) if p == int(old) else p for p in fronts]
        return fronts, int(found[-1][1])

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def start(models_dir: Path, log: Path, servers: int, **env: str) -> Service:
    port = free_port()
    full = {
        **os.environ,
        "MODELS_DIR": str(models_dir),
        "API_SERVERS": str(servers),
        "DEVICE": "cpu",
        "LOG_LEVEL": "WARNING",
        "INTRA_OP_THREADS": "1",
        "SHUTDOWN_GRACE_S": "10",
        **env,
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=full,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    service = Service(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{service.url}/ready", timeout=2).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    service.stop()
    raise AssertionError(f"not ready: {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def split_models(app_bundles, tmp_path_factory) -> Path:
    """Every tiny bundle, and `swap`: a versioned classify model (version 1) to swap under load."""
    root = tmp_path_factory.mktemp("split-models")
    for path in app_bundles.values():
        (root / path.name).symlink_to(path, target_is_directory=True)
    shutil.copytree(app_bundles["classify"], root / "swap" / "1")
    return root


@pytest.fixture(scope="module")
def three(split_models, tmp_path_factory) -> Iterator[Service]:
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("three") / "serve.log"
    service = start(split_models, log, 3, ADMIN_API_KEY="split-admin", GRPC_PORT=str(grpc_port))
    service.grpc = f"127.0.0.1:{grpc_port}"
    yield service
    assert service.stop() == 0


def answers(url: str) -> list[tuple[int, bytes]]:
    with httpx.Client(base_url=url, timeout=30) as client:
        return [(r.status_code, r.content) for r in (client.post(p, json=b) for p, b in REQUESTS)]


def test_three_front_ends_answer_as_one_process_bit_for_bit(three, split_models, tmp_path) -> None:
    one = start(split_models, tmp_path / "one.log", 1)
    try:
        single = answers(one.url)
    finally:
        assert one.stop() in (0, -signal.SIGTERM)  # one process: uvicorn ends by the signal it drained on
    assert all(status == 200 for status, _ in single), single
    for _ in range(3):  # new connections: the kernel spreads them over the front ends
        assert answers(three.url) == single


def test_the_front_ends_never_load_onnxruntime(three) -> None:
    fronts, engine = three.pids()
    assert "onnxruntime" in Path(f"/proc/{engine}/maps").read_text()
    for pid in fronts:
        assert "onnxruntime" not in Path(f"/proc/{pid}/maps").read_text()


def count(url: str, endpoint: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    pattern = rf'^bert_requests_total\{{endpoint="{re.escape(endpoint)}",model="ner",status="200"\}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def test_metrics_count_every_request_once_across_processes(three) -> None:
    before = count(three.url, "/ner")
    sent = 40
    for _ in range(sent):  # a new connection each: the requests land on every front end
        assert httpx.post(f"{three.url}/ner", json={"text": "Ada in London"}).status_code == 200
    assert count(three.url, "/ner") - before == sent
    assert count(three.url, "/ner") - before == sent  # any front end's scrape shows the same


def test_every_front_end_serves_grpc_on_the_one_port(three) -> None:
    import numpy as np
    import tritonclient.grpc as triton

    port = int(three.grpc.rpartition(":")[2])
    fronts, engine = three.pids()
    for pid in fronts:  # SO_REUSEPORT: the kernel spreads new connections over them
        listening = psutil.Process(pid).net_connections("tcp")
        assert any(c.status == "LISTEN" and c.laddr.port == port for c in listening), pid
    assert not any(c.laddr.port == port for c in psutil.Process(engine).net_connections("tcp"))
    endpoint = "/inference.GRPCInferenceService/ModelInfer"
    before = count(three.url, endpoint)
    sent = 20
    for _ in range(sent):  # a new channel each: a new connection
        client = triton.InferenceServerClient(three.grpc)
        text = triton.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"Ada in London"], dtype=object))
        entities = client.infer("ner", [text]).as_numpy("entities")
        client.close()
        assert entities.shape == (1,) and entities[0].startswith(b"[")
    assert count(three.url, endpoint) - before == sent


class Connection:
    """One keep-alive HTTP/1.1 connection, written by hand so that the test knows which connection
    (its local port) carried each request, and so which front end served it."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.port = self.sock.getsockname()[1]
        self.buffer = b""

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str]]:
        head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        self.sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        raw, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._read()
        self.buffer = self.buffer[length:]
        return int(status_line.split()[1]), headers

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


@dataclass
class Sent:
    at: float  # time.monotonic() when it was sent
    port: int  # the client's end of the connection that carried it
    status: int | None  # None: no answer (the connection failed)
    version: str | None


class Load:
    """Clients posting /classify to `swap` until stopped, each on its own keep-alive connection (a new
    one after a failure): every request, which connection carried it, and which front end process
    held that connection (`owners`, from the front ends' sockets)."""

    def __init__(self, service: Service, clients: int = 6):
        self.service, self.stop, self.sent = service, threading.Event(), []
        self.owners: dict[int, int] = {}  # local port -> pid of the front end holding the connection
        self.threads = [threading.Thread(target=self.client) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def owner(self, port: int) -> int | None:
        """The front end whose accepted socket is this connection's other end."""
        for process in psutil.Process(self.service.process.pid).children():
            try:
                if any(c.raddr and c.raddr.port == port for c in process.net_connections("tcp")):
                    return process.pid
            except psutil.NoSuchProcess:
                continue
        return None

    def client(self) -> None:
        body = b'{"text": "steady traffic", "model": "swap"}'
        connection = None
        while not self.stop.is_set():
            connection = connection or Connection(self.service.url)
            sent = Sent(time.monotonic(), connection.port, None, None)
            try:
                sent.status, headers = connection.post("/classify", body)
                sent.version = headers.get("x-model-version")
                if connection.port not in self.owners:  # accepted by now: its owner is known
                    self.owners[connection.port] = self.owner(connection.port)
            except OSError:
                connection.close()
                connection = None
            self.sent.append(sent)
        if connection is not None:
            connection.close()

    @property
    def answers(self) -> list[Sent]:
        return [s for s in self.sent if s.status is not None]

    @property
    def failures(self) -> list[Sent]:
        return [s for s in self.sent if s.status is None]

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def test_a_live_swap_under_load_loses_nothing_and_ends_the_old_version(
    three, split_models, app_bundles
) -> None:
    load = Load(three)
    try:
        time.sleep(1.0)
        shutil.copytree(app_bundles["classify"], split_models / "swap" / "2")
        reply = httpx.post(f"{three.url}/admin/models/swap/load", headers=ADMIN, timeout=60)
        acknowledged = time.monotonic()
        assert reply.status_code == 200, reply.text
        time.sleep(1.0)
    finally:
        load.finish()
    assert not load.failures and all(s.status == 200 for s in load.answers)
    assert {s.version for s in load.answers} == {"1", "2"}
    late = [s.version for s in load.answers if s.at > acknowledged]
    assert late and set(late) == {"2"}


def test_a_killed_front_end_loses_exactly_its_own_requests_and_is_restarted(three) -> None:
    load = Load(three, clients=6)
    try:
        deadline = time.monotonic() + 30
        while len(load.owners) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        # The front end holding the first client's connection: it serves at least that client.
        assert None not in load.owners.values(), load.owners
        victim = load.owners[load.sent[0].port]
        victim_ports = {port for port, pid in load.owners.items() if pid == victim}
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        while three.pids()[0].count(victim) and time.monotonic() < killed_at + 60:
            time.sleep(0.1)
        time.sleep(1.0)
        restarted_at = time.monotonic()
        time.sleep(1.0)
    finally:
        load.finish()
    fronts, _ = three.pids()
    assert victim not in fronts and len(fronts) == 3
    # Every connection the killed process held lost the one request it carried (in flight, or
    # written as the process died), and nothing else was lost: every other request was answered.
    lost = sorted(s.port for s in load.failures)
    assert lost == sorted(victim_ports), (lost, victim_ports, load.owners)
    assert all(s.at < killed_at + 1.0 for s in load.failures)
    assert all(s.status == 200 for s in load.answers)
    assert all(load.owners[s.port] != victim for s in load.answers if s.at > killed_at + 1.0)
    assert any(s.at > restarted_at for s in load.answers)  # the others kept serving throughout
    assert httpx.get(f"{three.url}/ready").status_code == 200


def test_a_killed_engine_ends_the_service_with_status_1(split_models, tmp_path) -> None:
    service = start(split_models, tmp_path / "serve.log", 2)
    fronts, engine = service.pids()
    os.kill(engine, signal.SIGKILL)
    assert service.process.wait(timeout=60) == 1  # the orchestrator restarts it (app/serve.py)
    for pid in fronts:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_sigterm_drains_every_process_and_exits_0(split_models, tmp_path) -> None:
    service = start(split_models, tmp_path / "serve.log", 2, MAX_WAIT_MS="2000", MAX_BATCH_SIZE="8")
    results: list[int] = []

    def slow() -> None:  # waits in the engine's batcher when SIGTERM arrives
        results.append(httpx.post(f"{service.url}/ner", json={"text": "Ada"}, timeout=30).status_code)

    threads = [threading.Thread(target=slow) for _ in range(4)]
    for thread in threads:
        thread.start()
    in_flight = r"^bert_in_flight_requests (\S+)$"  # every front end's, added up
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.findall(in_flight, httpx.get(f"{service.url}/metrics").text, re.M)
        if found and float(found[0]) >= 5:  # the 4, and this scrape
            break
    service.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join()
    assert service.process.wait(timeout=60) == 0
    assert results == [200] * 4


def test_python_m_app_passes_uvicorn_s_options_on(monkeypatch) -> None:
    """What the image's entrypoint runs: one process execs uvicorn with them; front ends get them too."""
    from app import serve

    class Exec(Exception):
        pass

    def fake_exec(path, command):
        raise Exec(command)

    monkeypatch.setattr(serve.os, "execv", fake_exec)
    monkeypatch.setattr(serve.os, "environ", {**os.environ})  # main() sets GRPC_HOST: not in this process's
    monkeypatch.setenv("API_SERVERS", "1")
    options = ["--log-level", "debug", "--proxy-headers", "--timeout-keep-alive", "75"]
    with pytest.raises(Exec) as e:
        serve.main(["--host", "127.0.0.1", "--port", "9", *options])
    (command,) = e.value.args
    assert command[command.index("app.main:app") + 1 :] == [
        *("--host", "127.0.0.1", "--port", "9"),
        *serve.UVICORN_ARGS,
        *options,
    ]
    monkeypatch.setenv("API_SERVERS", "2")
    with pytest.raises(SystemExit):  # its own front ends on one socket: no uvicorn workers of theirs
        serve.main(["--workers", "2"])
    supervisor = serve.Supervisor(2, "127.0.0.1", 9, 1.0, options)
    supervisor.listener = socket.socket()
    try:
        monkeypatch.setattr(serve.subprocess, "Popen", lambda command, **kwargs: command)
        assert supervisor._front_end()[-len(options) :] == options
    finally:
        supervisor.listener.close()
        shutil.rmtree(supervisor.work, ignore_errors=True)
