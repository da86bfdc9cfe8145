"""Kubernetes manifests, validated structurally; `kubectl kustomize` too where kubectl is installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.deploy.files import (
    K8S_BASE,
    K8S_GPU,
    check_env,
    compose,
    dockerfile_stages,
    entrypoint_graceful_timeout,
    load_yaml,
    load_yaml_docs,
    parse_yaml_docs,
)


@pytest.fixture(scope="module")
def base() -> dict[str, dict]:
    """kind -> the one object of that kind in the base kustomization's resources."""
    objects: dict[str, dict] = {}
    for resource in load_yaml(K8S_BASE / "kustomization.yaml")["resources"]:
        for doc in load_yaml_docs(K8S_BASE / resource):
            assert doc["kind"] not in objects, f"two {doc['kind']} objects"
            objects[doc["kind"]] = doc
    return objects


@pytest.fixture(scope="module")
def container(base) -> dict:
    (api,) = base["Deployment"]["spec"]["template"]["spec"]["containers"]
    return api


def test_all_manifests_are_listed(base):
    listed = set(load_yaml(K8S_BASE / "kustomization.yaml")["resources"])
    assert listed == {p.name for p in K8S_BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"} <= set(base)


def test_configmap_holds_real_settings(base, container):
    data = base["ConfigMap"]["data"]
    check_env(data, "deploy/k8s/base/configmap.yaml")
    assert "API_KEY" not in data, "a secret does not belong in a ConfigMap"
    assert container["envFrom"] == [{"configMapRef": {"name": base["ConfigMap"]["metadata"]["name"]}}]
    assert data["MAX_BODY_BYTES"] == compose()["x-api-env"]["MAX_BODY_BYTES"]


def probe_port(container: dict, probe: dict) -> int:
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    (named,) = [p for p in container["ports"] if p["name"] == port]
    return named["containerPort"]


def test_probes(base, container):
    port = int(base["ConfigMap"]["data"]["PORT"])
    expected = {"readinessProbe": "/ready", "livenessProbe": "/health", "startupProbe": "/health"}
    for probe, path in expected.items():
        assert container[probe]["httpGet"]["path"] == path, probe
        assert probe_port(container, container[probe]) == port, probe
    startup = container["startupProbe"]
    # Loading and warming may take a minute or more before liveness starts counting.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60


def test_resources_and_threads(base, container):
    resources = container["resources"]
    for section in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[section]), section
    # onnxruntime threads match the CPU the pod may use.
    assert int(base["ConfigMap"]["data"]["INTRA_OP_THREADS"]) == int(resources["limits"]["cpu"])


def test_graceful_shutdown(base, container):
    spec = base["Deployment"]["spec"]["template"]["spec"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    drain = int(command[1]) + entrypoint_graceful_timeout()
    assert spec["terminationGracePeriodSeconds"] > drain


def test_runs_as_the_image_user(base, container):
    pod = base["Deployment"]["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    image_user = [a for i, a in dockerfile_stages()["cpu"]["instructions"] if i == "USER"][-1]
    assert str(pod["runAsUser"]) == image_user.split(":")[0]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["image"] == compose()["services"]["api"]["image"]


def test_selectors_and_names_line_up(base, container):
    deployment = base["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    service = base["Service"]["spec"]
    assert service["selector"].items() <= pod_labels.items()
    (port,) = service["ports"]
    assert port["targetPort"] in [p["name"] for p in container["ports"]]
    target = base["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    pdb = base.get("PodDisruptionBudget")
    if pdb:
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_hpa_scales_on_cpu(base):
    hpa = base["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "replicas" not in base["Deployment"]["spec"], "the HPA owns the replica count"


def test_gpu_overlay(base):
    overlay = load_yaml(K8S_GPU / "kustomization.yaml")
    assert overlay["resources"] == ["../base"]
    assert overlay["images"] == [{"name": "bert-serving", "newTag": "gpu"}]
    patches = {}
    for patch in overlay["patches"]:
        doc = load_yaml(K8S_GPU / patch["path"])
        patches[doc["kind"]] = doc
    merged = {**base["ConfigMap"]["data"], **patches["ConfigMap"]["data"]}
    assert merged["DEVICE"] == "cuda"
    check_env(merged, "deploy/k8s/gpu ConfigMap")
    pod = patches["Deployment"]["spec"]["template"]["spec"]
    (gpu_container,) = pod["containers"]
    assert gpu_container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("directory", [K8S_BASE, K8S_GPU])
def test_kustomize_builds(directory):
    result = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    kinds = [d["kind"] for d in parse_yaml_docs(result.stdout)]
    assert {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"} <= set(kinds)
