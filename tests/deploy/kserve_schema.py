"""KServe manifests checked strictly against the models the kserve SDK generates from KServe's CRDs
(v1beta1 InferenceService, v1alpha1 ServingRuntime): unknown fields, wrong types and missing
required fields fail, and an InferenceService's runtime must exist and support its protocol.

Runs in a virtual environment with `kserve` (its pins conflict with ours):
    .venv-kserve/bin/python tests/deploy/kserve_schema.py deploy/k8s/kserve/*.yaml
Prints one problem a line; exits 1 when there is any.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import version
from typing import Any

import kserve
import kubernetes.client
import yaml

KINDS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
}
PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}  # V1beta1ModelSpec.protocol_version's documented values
SCALARS = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "datetime": (str,)}
QUANTITIES = {"ResourceQuantity", "IntOrString", "object"}


def model_class(name: str) -> Any:
    return getattr(kserve, name, None) or getattr(kubernetes.client, name, None)


def check(value: Any, type_name: str, where: str, problems: list[str]) -> None:
    if value is None:
        return
    # kserve writes list[T] and dict(str, T); the kubernetes client List[T] and Dict[str, T].
    if inner := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            problems.append(f"{where}: expected a list")
            return
        for i, item in enumerate(value):
            check(item, inner.group(1), f"{where}[{i}]", problems)
    elif inner := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            problems.append(f"{where}: expected a mapping")
            return
        for key, item in value.items():
            check(item, inner.group(1) or inner.group(2), f"{where}.{key}", problems)
    elif type_name in SCALARS:
        if not isinstance(value, SCALARS[type_name]) or (type_name == "int" and isinstance(value, bool)):
            problems.append(f"{where}: expected {type_name}, got {value!r}")
    elif type_name in QUANTITIES:
        if type_name != "object" and not isinstance(value, (str, int, float)):
            problems.append(f"{where}: expected a quantity, got {value!r}")
    else:
        check_object(value, type_name, where, problems)


def check_object(value: Any, type_name: str, where: str, problems: list[str]) -> None:
    cls = model_class(type_name)
    if cls is None:
        problems.append(f"{where}: the SDK has no model {type_name}")
        return
    if not isinstance(value, dict):
        problems.append(f"{where}: expected an object ({type_name})")
        return
    attributes = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in attributes:
            problems.append(f"{where}.{key}: unknown field of {type_name}")
        else:
            check(item, cls.openapi_types[attributes[key]], f"{where}.{key}", problems)
    try:  # the generated setters refuse a required field left out
        cls(**{attributes[k]: v for k, v in value.items() if k in attributes})
    except (ValueError, TypeError) as error:
        problems.append(f"{where}: {error}")


def problems_in(documents: list[dict]) -> list[str]:
    problems: list[str] = []
    runtimes = {}
    for doc in documents:
        kind = KINDS.get((doc.get("apiVersion"), doc.get("kind")))
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if kind is None:
            problems.append(f"{name}: not a KServe kind this checks ({doc.get('apiVersion')})")
            continue
        check_object(doc, kind, name, problems)
        if doc["kind"].endswith("ServingRuntime"):
            runtimes[doc["metadata"]["name"]] = doc["spec"]
    for doc in documents:
        model = (
            (doc.get("spec", {}).get("predictor") or {}).get("model")
            if doc.get("kind") == "InferenceService"
            else None
        )
        if not model:
            continue
        where = f"InferenceService/{doc['metadata']['name']}.spec.predictor.model"
        protocol = model.get("protocolVersion")
        if protocol not in PROTOCOLS:
            problems.append(f"{where}.protocolVersion: {protocol!r} is none of {sorted(PROTOCOLS)}")
        runtime = runtimes.get(model.get("runtime"))
        if runtime is None:
            problems.append(
                f"{where}.runtime: no ServingRuntime {model.get('runtime')!r} among the manifests"
            )
            continue
        if protocol not in runtime.get("protocolVersions", []):
            problems.append(f"{where}: runtime {model['runtime']!r} does not speak {protocol!r}")
        formats = {f.get("name") for f in runtime.get("supportedModelFormats", [])}
        if model.get("modelFormat", {}).get("name") not in formats:
            problems.append(
                f"{where}.modelFormat: runtime {model['runtime']!r} supports only {sorted(formats)}"
            )
    return problems


if __name__ == "__main__":
    docs = [doc for path in sys.argv[1:] for doc in yaml.safe_load_all(open(path)) if doc]
    found = problems_in(docs)
    print("\n".join(found) or f"{len(docs)} manifests valid against kserve {version('kserve')}")
    sys.exit(1 if found else 0)
