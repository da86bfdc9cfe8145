"""Readers shared by the deploy tests: deployment files, the service's settings and metrics, PromQL names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
K8S_BASE = DEPLOY / "k8s" / "base"
K8S_GPU = DEPLOY / "k8s" / "gpu"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "bert-serving.json"

# The settings the issue lists, used when app/settings.py cannot be imported yet.
LISTED_SETTINGS = {
    "MODELS_DIR",
    "DEVICE",
    "CPU_VARIANT",
    "INTRA_OP_THREADS",
    "MAX_BATCH_SIZE",
    "MAX_BATCH_TOKENS",
    "MAX_WAIT_MS",
    "MAX_QUEUE",
    "MAX_BODY_BYTES",
    "API_KEY",
    "CORS_ORIGINS",
    "LOG_LEVEL",
    "HOST",
    "PORT",
    "WORKERS",
}
# Series the app must expose (the metric names agreed in the issue; histograms as their parts).
AGREED_METRICS = {
    "bert_requests_total": "counter",
    "bert_request_latency_seconds": "histogram",
    "bert_stage_seconds": "histogram",
    "bert_batch_size": "histogram",
    "bert_queue_depth": "gauge",
    "bert_rejected_total": "counter",
}
SERIES_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def series_names(families: dict[str, str]) -> set[str]:
    """{family: type} -> the series names a scrape shows (counter families are named without _total)."""
    names = set()
    for family, kind in families.items():
        base = family.removesuffix("_total") if kind == "counter" else family
        names |= {base + suffix for suffix in SERIES_SUFFIXES.get(kind, ("",))}
    return names


def app_metric_families() -> dict[str, str] | None:
    """{family: type} of everything app/observe/metrics.py registers; None if the app does not import."""
    try:
        from app.observe.metrics import Metrics
    except ImportError:
        return None
    return {family.name: family.type for family in Metrics().registry.collect()}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def parse_yaml_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return parse_yaml_docs(path.read_text(encoding="utf-8"))


def compose() -> dict[str, Any]:
    return load_yaml(DEPLOY / "docker-compose.yml")


def entrypoint_vars() -> set[str]:
    """Variables the entrypoint itself reads with a default, e.g. `${PORT:-8000}`."""
    return set(re.findall(r"\$\{([A-Z_]+):-", ENTRYPOINT.read_text(encoding="utf-8")))


def settings_class() -> type | None:
    try:
        from app.settings import Settings
    except ImportError:
        return None
    return Settings


def setting_env_names(settings_cls: type) -> set[str]:
    """Environment names pydantic-settings reads for `settings_cls` (no prefix, any case)."""
    names = set()
    for name, info in settings_cls.model_fields.items():
        alias = info.validation_alias or info.alias
        names.add((alias if isinstance(alias, str) else name).upper())
    return names


def known_env_names() -> set[str]:
    """Every variable a deployment may set: the app's settings plus what the entrypoint reads."""
    settings_cls = settings_class()
    app_names = setting_env_names(settings_cls) if settings_cls else LISTED_SETTINGS
    return app_names | entrypoint_vars()


def check_env(env: dict[str, Any], where: str) -> None:
    """Every key is a real setting, and the app's Settings accepts the values."""
    unknown = set(env) - known_env_names()
    assert not unknown, f"{where} sets variables no component reads: {sorted(unknown)}"
    settings_cls = settings_class()
    if settings_cls is None:
        return
    fields = {k.lower(): str(v) for k, v in env.items() if k in setting_env_names(settings_cls)}
    settings_cls(**fields)  # raises pydantic.ValidationError naming the bad value


def dockerfile_stages(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """{stage name: {"base": image, "instructions": [(INSTRUCTION, args), ...]}} in file order."""
    text = (path or ROOT / "Dockerfile").read_text(encoding="utf-8")
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # comment lines inside a continuation are dropped
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in logical:
        instruction, _, args = line.strip().partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else f"stage{len(stages)}"
            current = stages[name] = {"base": words[0], "instructions": []}
        elif current is not None:
            current["instructions"].append((instruction, args.strip()))
    return stages


PROMETHEUS_BUILTINS = {"up"}
PROMQL_KEYWORDS = set(
    "by without on ignoring group_left group_right bool and or unless offset inf nan".split()
)


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, labels or keywords."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        word, rest = match.group(0), expr[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_KEYWORDS:
            continue
        if match.start() > 0 and (expr[match.start() - 1].isdigit() or expr[match.start() - 1] == "."):
            continue  # the exponent of 1e-9 and the like
        names.add(word)
    return names
