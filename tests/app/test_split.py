"""One engine, many front ends (API_SERVERS, app/serve.py), as real processes on the tiny bundles:
the same answers as one process, bit for bit; metrics counted once across processes; a live swap
under load that loses nothing and never answers from the old version after its acknowledgement;
a killed front end restarted while the others serve; a killed engine ending the service with
status 1 (the documented choice); SIGTERM draining every process to exit 0."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
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
    service = start(
        split_models, tmp_path_factory.mktemp("three") / "serve.log", 3, ADMIN_API_KEY="split-admin"
    )
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


class Load:
    """Clients posting /classify to `swap` until stopped; each answer's version, and any failure."""

    def __init__(self, url: str, clients: int = 6):
        self.url, self.stop, self.answers, self.failures = url, threading.Event(), [], []
        self.threads = [threading.Thread(target=self.client) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    r = client.post("/classify", json={"text": "steady traffic", "model": "swap"})
                    self.answers.append((sent, r.status_code, r.headers.get("x-model-version")))
                except httpx.HTTPError as e:
                    self.failures.append(repr(e))

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def test_a_live_swap_under_load_loses_nothing_and_ends_the_old_version(
    three, split_models, app_bundles
) -> None:
    load = Load(three.url)
    try:
        time.sleep(1.0)
        shutil.copytree(app_bundles["classify"], split_models / "swap" / "2")
        reply = httpx.post(f"{three.url}/admin/models/swap/load", headers=ADMIN, timeout=60)
        acknowledged = time.monotonic()
        assert reply.status_code == 200, reply.text
        time.sleep(1.0)
    finally:
        load.finish()
    assert not load.failures and all(status == 200 for _, status, _ in load.answers)
    assert {version for _, _, version in load.answers} == {"1", "2"}
    late = [version for sent, _, version in load.answers if sent > acknowledged]
    assert late and set(late) == {"2"}


def test_a_killed_front_end_is_restarted_and_only_its_requests_are_lost(three) -> None:
    fronts, _ = three.pids()
    load = Load(three.url, clients=6)
    try:
        time.sleep(0.5)
        os.kill(fronts[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while three.pids()[0][0] == fronts[0] and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        killed_at = time.monotonic()
        time.sleep(1.0)
    finally:
        load.finish()
    restarted, _ = three.pids()
    assert restarted[0] != fronts[0] and restarted[1:] == fronts[1:]
    # At most one request per client was in flight on the killed process; nothing else failed.
    assert len(load.failures) <= 6 and all(status == 200 for _, status, _ in load.answers)
    assert any(sent > killed_at for sent, _, _ in load.answers)
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
