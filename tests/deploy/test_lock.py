"""The lock files: current with pyproject.toml, hash-pinned, what make and the image install, and
pyproject's floors the versions the suite passed on (scripts/lock.py writes them)."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement

from scripts.lock import DIGEST_LINE, LEFT_OUT, LOCKS, inputs_digest
from tests.deploy.files import ROOT, dockerfile_stages

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def read_lock(name: str) -> tuple[str, dict[str, tuple[Requirement, list[str]]]]:
    """The lock's recorded digest and its pins: name -> (requirement, hashes)."""
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    digest = text.splitlines()[0].removeprefix(DIGEST_LINE)
    pins = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.replace("\\\n", " ")):
        if block.startswith("#"):
            block = "\n".join(line for line in block.splitlines() if not line.startswith("#"))
        if not block.strip():
            continue
        spec, *hashes = block.split("--hash=")
        requirement = Requirement(spec.strip())
        pins[requirement.name.lower()] = (requirement, [h.strip() for h in hashes])
    return digest, pins


def group_requirements(extras: list[str]) -> list[Requirement]:
    texts = PROJECT["dependencies"] + [r for e in extras for r in PROJECT["optional-dependencies"][e]]
    return [Requirement(t) for t in texts]


def pinned_version(requirement: Requirement) -> str:
    (spec,) = requirement.specifier
    assert spec.operator == "==", requirement
    return spec.version


@pytest.mark.parametrize("name", list(LOCKS))
def test_lock_is_current_pinned_and_hashed(name):
    digest, pins = read_lock(name)
    # pyproject's dependency lists changed since the lock was written: run `python scripts/lock.py`.
    assert digest == inputs_digest(), f"requirements/{name}.txt is stale: run python scripts/lock.py"
    for requirement, hashes in pins.values():
        pinned_version(requirement)
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), requirement
    for wanted in group_requirements(LOCKS[name]):
        if wanted.name in LEFT_OUT:
            assert wanted.name not in pins  # installed first, the CPU build
            continue
        locked, _ = pins[wanted.name.lower()]
        assert wanted.specifier.contains(pinned_version(locked), prereleases=True), (wanted, locked)


def test_floors_are_the_tested_versions():
    """A `>=` floor in pyproject.toml is the version the suite passed on (the lock's), never an
    older release nobody ran."""
    locked = {**read_lock("serve-gpu")[1], **read_lock("dev")[1]}
    for extras in [[], *([e] for e in PROJECT["optional-dependencies"])]:
        for wanted in group_requirements(extras):
            floors = [s.version for s in wanted.specifier if s.operator == ">="]
            if wanted.name in LEFT_OUT:
                assert floors == ["2.13.0"], wanted
                continue
            version = pinned_version(locked[wanted.name.lower()][0])
            assert floors == [version], f"{wanted}: the tested version is {version}"


def test_make_and_the_image_install_from_the_locks():
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q --require-hashes -r requirements/dev.txt" in makefile
    assert re.search(r"pip install -q --no-deps .*-e \.", makefile)  # the project itself: no deps
    assert "-e '.[" not in makefile
    stages = dockerfile_stages()
    for stage, lock in (("builder", "train"), ("cpu", "serve"), ("gpu", "serve-gpu")):
        instructions = stages[stage]["instructions"]
        assert ("COPY", f"requirements/{lock}.txt /tmp/requirements.txt") in instructions
        runs = [args for kind, args in instructions if kind == "RUN"]
        assert any("pip install --require-hashes -r /tmp/requirements.txt" in r for r in runs), stage
        # Nothing else is installed with its dependencies resolved afresh.
        for run in runs:
            for install in re.findall(r"pip install ([^&]*)", run):
                assert "--require-hashes" in install or "--no-deps" in install or "torch==" in install, run


def test_this_environment_matches_the_serving_lock():
    """Where the suite runs, the serving packages are the locked versions (make installs the lock):
    the pins are what the tests pass on."""
    environment = default_environment()
    for requirement, _ in read_lock("serve")[1].values():
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        installed = importlib.metadata.version(requirement.name)
        assert installed == pinned_version(requirement), (
            f"{requirement.name} {installed} is not the locked one"
        )
