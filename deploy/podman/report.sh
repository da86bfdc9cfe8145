#!/usr/bin/env bash
# Build the full CPU image from scratch (no layer cache), record its build time and size, and check
# its contract (tests/deploy/test_image.py) on it. Writes benchmarks/results/image.{md,json}.
#
#   bash deploy/podman/report.sh
#
# Here, with no registry and no PyTorch index: the stand-in base and pip's local wheelhouse.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=localhost/bert-serving:cpu
STANDIN=localhost/python-standin:3.11-slim
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}"
LOGS="$(mktemp -d)"
bash deploy/podman/standins.sh python
wheelhouse="$(pip config get global.find-links 2>/dev/null || true)"
compgen -G "$wheelhouse/torch-*.whl" > /dev/null || wheelhouse=""
load_before="$(cut -d' ' -f1 /proc/loadavg)"
started=$(date +%s)
PYTHON_IMAGE="$STANDIN" TORCH_WHEELHOUSE="$wheelhouse" bash deploy/podman/build.sh "$IMAGE" --no-cache \
  > "$LOGS/build.log" 2>&1 || { tail -50 "$LOGS/build.log"; exit 1; }
build_s=$(( $(date +%s) - started ))
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
base_size=$(podman image inspect --format '{{.Size}}' "$STANDIN")
models_mb=$(podman run --rm --entrypoint du "$IMAGE" -sm /models | cut -f1)
set +e
IMAGE_UNDER_TEST="$IMAGE" .venv/bin/python -m pytest tests/deploy/test_image.py -vv -p no:cacheprovider > "$LOGS/contract.log" 2>&1
contract_rc=$?
set -e
summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$LOGS/contract.log" | tail -1 | tr -d '=' | xargs)"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
python3 - "$build_s" "$size" "$base_size" "$models_mb" "$contract_rc" "$summary" "$cpu" "$load_before" "$LOGS/contract.log" <<'PY'
import json, sys
build_s, size, base, models_mb, rc, summary, cpu, load, log = sys.argv[1:]
tests = [line.split(" ")[0].split("::")[-1] + " " + line.split(" ")[1]
         for line in open(log) if "::" in line and (" PASSED" in line or " FAILED" in line or " SKIPPED" in line)]
result = {
    "command": "bash deploy/podman/report.sh",
    "image": "localhost/bert-serving:cpu (Dockerfile --target cpu, all six defaults)",
    "base": "localhost/python-standin:3.11-slim (deploy/podman/standins.sh: Debian bookworm's python3 3.11)",
    "build_seconds_no_cache": int(build_s),
    "size_mb": round(int(size) / 1e6),
    "base_size_mb": round(int(base) / 1e6),
    "models_mb": int(models_mb),
    "contract": {"passed": rc == "0", "summary": summary, "tests": tests},
    "cpu": cpu,
    "load_average_at_start": float(load),
    "cores": 2,
}
json.dump(result, open("benchmarks/results/image.json", "w"), indent=2)
lines = [
    "# The CPU image, built and checked", "",
    f"`{result['command']}` on {cpu} (2 cores, load average {load} at the start).", "",
    "| what | value |", "|---|---:|",
    f"| build time, no layer cache (pip installs, six defaults exported) | {build_s} s |",
    f"| image size | {result['size_mb']} MB |",
    f"| of which the base image | {result['base_size_mb']} MB |",
    f"| of which /models (six defaults, four CPU variants each) | {models_mb} MB |", "",
    f"Contract (`tests/deploy/test_image.py` with `IMAGE_UNDER_TEST`): **{summary}**", "",
    *[f"- {t}" for t in tests], "",
    "The base is the stand-in for `python:3.11-slim` (no registry here); real users build on the official image.",
]
open("benchmarks/results/image.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit "$contract_rc"
