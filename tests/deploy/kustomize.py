"""The part of kustomize that deploy/k8s uses, to render the manifests where kubectl is not installed.

`resources` (files, and directories holding a kustomization), `images` (newName, newTag, digest) and
`patches` given by `path` (strategic merge patches, matched to their target by kind and name). A
kustomization or patch using anything else raises NotImplementedError rather than rendering it wrong;
where kubectl exists, tests/deploy/test_k8s.py checks this output equals `kubectl kustomize`.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "images", "patches"}
# Lists Kubernetes merges by a key in a strategic merge patch (the rest are replaced whole).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def build(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize directory` would print (in resource order)."""
    kustomization = load_docs(directory / "kustomization.yaml")[0]
    unsupported = set(kustomization) - SUPPORTED
    if unsupported:
        raise NotImplementedError(f"{directory}: kustomize fields not rendered here: {sorted(unsupported)}")
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        objects += build(path) if path.is_dir() else load_docs(path)
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise NotImplementedError(f"{directory}: only `path` patches are rendered here, not {patch}")
        for doc in load_docs(directory / patch["path"]):
            index = target_index(objects, doc)
            objects[index] = strategic_merge(objects[index], doc)
    for image in kustomization.get("images", []):
        for obj in objects:
            set_image(obj, image)
    return objects


def target_index(objects: list[dict[str, Any]], patch: dict[str, Any]) -> int:
    kind, name = patch["kind"], patch["metadata"]["name"]
    found = [i for i, o in enumerate(objects) if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(found) != 1:
        raise ValueError(f"patch for {kind}/{name} matches {len(found)} resources")
    return found[0]


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """Kubernetes' strategic merge: maps merge (null deletes), keyed lists merge by key, others replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for name, value in patch.items():
            if name.startswith("$"):
                raise NotImplementedError(f"patch directive {name} is not rendered here")
            if value is None:
                merged.pop(name, None)
            elif name in merged:
                merged[name] = strategic_merge(merged[name], value, MERGE_KEYS.get(name))
            else:
                merged[name] = copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key is not None:
        merged_list = copy.deepcopy(base)
        for item in patch:
            same = [i for i, old in enumerate(merged_list) if old.get(key) == item.get(key)]
            if same:
                merged_list[same[0]] = strategic_merge(merged_list[same[0]], item)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def set_image(obj: dict[str, Any], image: dict[str, str]) -> None:
    """kustomize's images transformer on every container of a pod template."""
    if obj["kind"] not in POD_TEMPLATE_KINDS:
        return
    spec = obj["spec"]["template"]["spec"]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        match = re.fullmatch(r"([^:@]+(?::\d+/[^:@]+)?)(?::([^@]+))?(?:@(.+))?", container["image"])
        assert match, container["image"]
        name, tag, digest = match.groups()
        if name != image["name"]:
            continue
        name = image.get("newName", name)
        if "digest" in image:
            container["image"] = f"{name}@{image['digest']}"
            continue
        tag = image.get("newTag", tag)
        container["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest and not tag else "")
