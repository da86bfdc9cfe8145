"""The KServe path (deploy/k8s/kserve): the ServingRuntime and InferenceService validate strictly
against the kserve SDK's CRD models, in the SDK's own virtual environment (its pins conflict with
ours), and the validator catches what it must."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KSERVE = ROOT / "deploy" / "k8s" / "kserve"
VALIDATOR = ROOT / "tests" / "deploy" / "kserve_schema.py"
PYTHON = Path(os.environ.get("KSERVE_PYTHON", ROOT / ".venv-kserve" / "bin" / "python"))

needs_kserve = pytest.mark.skipif(
    not PYTHON.exists(),
    reason=f"no kserve SDK: python3 -m venv .venv-kserve && .venv-kserve/bin/pip install kserve "
    f"(.ci/run does), or KSERVE_PYTHON=... ({PYTHON} absent)",
)


def validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PYTHON), str(VALIDATOR), *map(str, paths)], capture_output=True, text=True, timeout=120
    )


@needs_kserve
def test_the_manifests_validate_against_kserves_crd_models():
    done = validate(*sorted(KSERVE.glob("*.yaml")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 manifests valid" in done.stdout


def test_the_predictor_speaks_v2_with_the_services_own_probes():
    runtime = yaml.safe_load((KSERVE / "servingruntime.yaml").read_text())
    service = yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text())
    assert (
        service["spec"]["predictor"]["model"]["protocolVersion"] == "v2"
        and "v2" in runtime["spec"]["protocolVersions"]
    )
    (container,) = runtime["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    port = container["ports"][0]["containerPort"]
    assert {"name": "PORT", "value": str(port)} in container["env"], "the service listens where KServe routes"
    assert (
        container["securityContext"]["runAsUser"] == 10001
        and container["securityContext"]["readOnlyRootFilesystem"]
    )


@needs_kserve
@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda s: s.replace("protocolVersion: v2", "protocolVersion: v3"), "'v3' is none of"),
        (lambda s: s.replace("minReplicas:", "minReplica:"), "minReplica: unknown field"),
        (lambda s: s.replace("runtime: bert-serving", "runtime: absent"), "no ServingRuntime 'absent'"),
        (lambda s: s.replace("maxReplicas: 10", "maxReplicas: ten"), "expected int"),
    ],
)
def test_the_validator_catches_a_broken_manifest(tmp_path, edit, problem):
    broken = tmp_path / "inferenceservice.yaml"
    broken.write_text(edit((KSERVE / "inferenceservice.yaml").read_text()))
    done = validate(KSERVE / "servingruntime.yaml", broken)
    assert done.returncode == 1 and problem in done.stdout, done.stdout + done.stderr
