"""Kubernetes manifests: rendered as kustomize does (tests/deploy/kustomize.py, checked against
`kubectl kustomize` where kubectl is installed), validated against the official schemas of the
Kubernetes version deploy/k8s/README.md names (kubernetes-validate), and checked for consistency."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess

import pytest

from tests.deploy.files import (
    K8S_BASE,
    K8S_GPU,
    app_metric_families,
    check_env,
    compose,
    dockerfile_stages,
    load_yaml,
    load_yaml_docs,
    parse_yaml_docs,
    series_names,
)
from tests.deploy.kustomize import build

OVERLAYS = {"base": K8S_BASE, "gpu": K8S_GPU, "queue": K8S_BASE.parent / "queue"}
# After the grace period the batchers drain what is queued and the process exits: a few seconds.
EXIT_MARGIN_S = 5


def kubernetes_version() -> str:
    """The version deploy/k8s/README.md says the manifests are validated against, e.g. 1.32."""
    match = re.search(r"Kubernetes (1\.\d+) API schemas", (K8S_BASE.parent / "README.md").read_text())
    assert match, "deploy/k8s/README.md must name the Kubernetes version (`Kubernetes 1.NN API schemas`)"
    return match.group(1)


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_graceful_shutdown_fits_the_grace_period(overlay):
    """preStop, then SIGTERM: uvicorn drains for up to SHUTDOWN_GRACE_S (the entrypoint passes it on),
    then the app stops; all of it must end before the kubelet's SIGKILL."""
    objects = by_kind(build(OVERLAYS[overlay]))
    spec = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    grace = float(objects["ConfigMap"]["data"]["SHUTDOWN_GRACE_S"])
    assert spec["terminationGracePeriodSeconds"] >= int(command[1]) + grace + EXIT_MARGIN_S
    # The endpoints controller drops a pod within a readiness period or so; the sleep covers that.
    assert int(command[1]) >= container["readinessProbe"]["periodSeconds"]


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
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [port["targetPort"] for port in service["ports"]] == ["http", "grpc"]
    assert set(named) == {"http", "grpc"}
    settings = base["ConfigMap"]["data"]
    assert (named["http"], named["grpc"]) == (int(settings["PORT"]), int(settings["GRPC_PORT"]))
    target = base["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    pdb = base.get("PodDisruptionBudget")
    if pdb:
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_scales_on_cpu_or_a_metric_the_service_exports(overlay):
    objects = by_kind(build(OVERLAYS[overlay]))
    hpa = objects["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    exported = series_names(app_metric_families() or {})
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Resource":
            assert metric["resource"]["name"] == "cpu", metric
        else:  # Pods / Object / External, through a metrics adapter: a series /metrics really has
            name = metric[metric["type"].lower()]["metric"]["name"]
            assert name in exported, f"the HPA scales on {name}, which the service does not export"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "replicas" not in objects["Deployment"]["spec"], "the HPA owns the replica count"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_validate_against_the_kubernetes_schemas(overlay):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    objects = build(OVERLAYS[overlay])
    assert {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"} <= set(by_kind(objects))
    for obj in objects:
        # strict: an unknown or misspelt field fails too, not only a wrong type.
        kubernetes_validate.validate(obj, kubernetes_version() + ".0", strict=True)


def test_schema_validation_catches_a_misspelt_field():
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    deployment = copy.deepcopy(by_kind(build(K8S_BASE))["Deployment"])
    spec = deployment["spec"]["template"]["spec"]
    spec["terminationGracePeriod"] = spec.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_version() + ".0", strict=True)


def test_renderer_refuses_what_it_does_not_know(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(NotImplementedError, match="namePrefix"):
        build(tmp_path)


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
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renderer_matches_kubectl_kustomize(overlay):
    result = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS[overlay])], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr

    def key(obj: dict) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    assert sorted(parse_yaml_docs(result.stdout), key=key) == sorted(build(OVERLAYS[overlay]), key=key)
