"""The CPU image, built from the repository's Dockerfile with podman and run as compose and
Kubernetes run it (uid 10001, read-only root, a tmpfs on /tmp): healthy by its own HEALTHCHECK,
sensible answers, hostile inputs answered, no torch and no build tools inside, and a SIGTERM that
finishes the requests in flight.

Building takes minutes, so it runs where asked: `IMAGE_TESTS=1` builds a slim image (the same
stages, one default model, one variant; .ci/run sets it), `IMAGE_UNDER_TEST=bert-serving:cpu`
checks an image already built (deploy/podman/report.sh does so for the full image).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from deploy.podman.stack import podman
from scripts import check_endpoints
from tests.reliability.conftest import API_KEY, AUTH
from tests.reliability.live import free_port
from tests.reliability.test_hostile_inputs import hostile_text_cases, malformed_cases, run_cases

ROOT = Path(__file__).resolve().parents[2]
STANDIN = "localhost/python-standin:3.11-slim"
SLIM = "localhost/bert-serving:slim-test"
SLIM_EXPORT = "--only sst2-minilm --variants int8-rowwise"
UNDER_TEST = os.environ.get("IMAGE_UNDER_TEST")

pytestmark = [
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="podman not installed (apt-get install podman runc)"
    ),
    pytest.mark.skipif(
        not (UNDER_TEST or os.environ.get("IMAGE_TESTS")),
        reason="builds a container image (minutes): set IMAGE_TESTS=1 (.ci/run does) or IMAGE_UNDER_TEST",
    ),
]


def torch_wheelhouse() -> str | None:
    """pip's configured find-links, where it holds the CPU torch wheel (no PyTorch index here)."""
    found = subprocess.run(["pip", "config", "get", "global.find-links"], capture_output=True, text=True)
    folder = Path(found.stdout.strip()) if found.returncode == 0 and found.stdout.strip() else None
    return str(folder) if folder and any(folder.glob("torch-*.whl")) else None


@pytest.fixture(scope="module")
def image() -> str:
    if UNDER_TEST:
        return UNDER_TEST
    if subprocess.run(["which", "mmdebstrap"], capture_output=True).returncode != 0:
        pytest.skip("mmdebstrap not installed (apt-get install mmdebstrap): no base image can be made here")
    subprocess.run(["bash", str(ROOT / "deploy/podman/standins.sh"), "python"], check=True, timeout=1200)
    env = {**os.environ, "PYTHON_IMAGE": STANDIN, "EXPORT_ARGS": SLIM_EXPORT}
    if wheelhouse := torch_wheelhouse():
        env["TORCH_WHEELHOUSE"] = wheelhouse
    build = subprocess.run(
        ["bash", str(ROOT / "deploy/podman/build.sh"), SLIM],
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return SLIM


class Container:
    """One container of `image`, run with the compose file's environment and the k8s security."""

    def __init__(self, image: str, name: str, **env: str) -> None:
        self.name, self.port, grpc_port = name, free_port(), free_port()
        podman("rm", "-f", name, check=False)
        podman(
            "run", "-d", "--name", name, "--read-only", "--tmpfs", "/tmp:rw,size=256m,mode=1777",
            "-p", f"127.0.0.1:{self.port}:8000", "-p", f"127.0.0.1:{grpc_port}:8001",
            "-e", f"API_KEY={API_KEY}", "-e", "SHUTDOWN_GRACE_S=10", "-e", "INTRA_OP_THREADS=2",
            *(f"--env={key}={value}" for key, value in env.items()),
            image,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc = f"127.0.0.1:{grpc_port}"  # the image's GRPC_PORT, 8001

    def wait_healthy(self, timeout: float = 300) -> None:
        """Healthy by the image's own HEALTHCHECK command, then ready (every model loaded)."""
        deadline = time.monotonic() + timeout
        while podman("healthcheck", "run", self.name, check=False).returncode != 0:
            assert self.running(), self.logs()
            assert time.monotonic() < deadline, f"not healthy in {timeout}s:\n{self.logs()}"
            time.sleep(1)
        while get(f"{self.url}/ready") != 200:
            assert time.monotonic() < deadline, f"not ready in {timeout}s:\n{self.logs()}"
            time.sleep(1)

    def running(self) -> bool:
        return (
            podman("inspect", "--format", "{{.State.Running}}", self.name, check=False).stdout.strip()
            == "true"
        )

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return (done.stdout + done.stderr)[-4000:]

    def exec(self, *command: str) -> subprocess.CompletedProcess:
        return podman("exec", self.name, *command, check=False)

    def remove(self) -> None:
        podman("rm", "-f", "-t", "0", self.name, check=False)


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except Exception:  # noqa: BLE001 - not up yet
        return 0


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[Container]:
    running = Container(image, "bert-image-test")
    try:
        running.wait_healthy()
        yield running
    finally:
        running.remove()


def served_paths(container: Container) -> set[str]:
    with urllib.request.urlopen(urllib.request.Request(f"{container.url}/models", headers=AUTH)) as response:
        models = json.loads(response.read())
    listed = models["models"] if isinstance(models, dict) else models
    tasks = {m["task"] for m in listed}
    paths = {"classify": {"classify"}, "ner": {"ner"}, "qa": {"qa"}, "multiple-choice": {"multiple-choice"}}
    paths["embed"] = {"embed", "v1/embeddings", "similarity"}
    if any(m["name"] == "rerank-minilm" for m in listed):  # the default reranker (a classify model)
        paths["rerank"] = {"rerank", "v1/rerank"}
        tasks.add("rerank")
    return set().union(*(paths.get(task, set()) for task in tasks))


def test_runs_as_uid_10001_on_a_read_only_root(container):
    assert container.exec("id", "-u").stdout.strip() == "10001"
    assert container.exec("touch", "/srv/written").returncode != 0, "the root filesystem must be read-only"
    assert container.exec("touch", "/tmp/written").returncode == 0, "/tmp is the writable tmpfs"


def test_every_endpoint_of_its_models_answers_sensibly(container):
    paths = served_paths(container)
    assert paths, "the image serves no model"
    if UNDER_TEST:
        assert paths == {path for path, _, _ in check_endpoints.CHECKS}, "the full image serves every default"
    checks = [check for check in check_endpoints.CHECKS if check[0] in paths]
    assert not check_endpoints.problems(container.url, AUTH, checks=checks)


def test_kserve_v2_inference_answers(container):
    """The route a KServe InferenceService (deploy/k8s/kserve) sends its V2 requests to."""
    text = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["A wonderful, moving film."]}
    answer = check_endpoints.post(container.url, "v2/models/sst2-minilm/infer", {"inputs": [text]}, AUTH)
    outputs = {output["name"]: output["data"] for output in answer["outputs"]}
    assert answer["model_name"] == "sst2-minilm" and outputs["label"] == ["positive"]


def test_kserve_v2_over_grpc_answers(container):
    """What Triton's gRPC client, or KServe's `protocolVersion: grpc-v2`, reaches on the image's 8001."""
    client = grpcclient.InferenceServerClient(container.grpc)
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array(["A wonderful, moving film."], dtype=object))
    result = client.infer("sst2-minilm", [text], headers={"authorization": f"Bearer {API_KEY}"})
    assert result.as_numpy("label").tolist() == [b"positive"]
    client.close()


def test_hostile_inputs_get_answers_or_clear_4xx(container):
    paths = {f"/{path}" for path in served_paths(container)}
    cases = [case for case in hostile_text_cases() + malformed_cases() if case.path in paths]
    assert cases
    problems = run_cases(container.url, cases)
    assert not problems, "\n".join(problems)


def test_no_torch_and_no_build_tools_inside(image):
    listing = podman(
        "run", "--rm", "--entrypoint", "sh", image, "-c",
        "pip list --format=freeze; for tool in gcc cc g++ make ld; do command -v $tool; done; true",
    ).stdout  # fmt: skip
    names = {line.split("==")[0].lower() for line in listing.splitlines() if "==" in line}
    assert "onnxruntime" in names and "torch" not in names, sorted(names)
    assert not [line for line in listing.splitlines() if line.startswith("/")], listing


@pytest.mark.parametrize("servers", ["1", "2"])
def test_sigterm_finishes_the_requests_in_flight(image, servers):
    """One process, or (API_SERVERS=2) two front ends over one engine process under app/serve.py."""
    draining = Container(image, f"bert-image-sigterm-{servers}", API_SERVERS=servers)
    try:
        draining.wait_healthy()
        if servers != "1":
            assert "2 front ends" in draining.logs()
            client = grpcclient.InferenceServerClient(draining.grpc)  # every front end serves gRPC
            text = grpcclient.InferInput("text", [1], "BYTES")
            text.set_data_from_numpy(np.array(["A dull, lifeless film."], dtype=object))
            result = client.infer("sst2-minilm", [text], headers={"authorization": f"Bearer {API_KEY}"})
            assert result.as_numpy("label").tolist() == [b"negative"]
            client.close()
        body = {"inputs": [{"text": "A wonderful, moving film with a brilliant cast."}] * 32}
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [
                pool.submit(check_endpoints.post, draining.url, "classify", body, AUTH) for _ in range(16)
            ]
            time.sleep(0.3)  # all sent, most still queued behind two cores
            podman("kill", "-s", "TERM", draining.name)
            answers = [future.result(timeout=60) for future in futures]
        assert all(len(answer["results"]) == 32 for answer in answers)
        assert podman("wait", draining.name, timeout=60).stdout.strip() == "0", draining.logs()
    finally:
        draining.remove()
