#!/usr/bin/env bash
# Build the Dockerfile's CPU image with podman on a machine without a Docker engine.
#
#   deploy/podman/build.sh [IMAGE] [extra podman build args...]     (IMAGE default bert-serving:cpu)
#
# Environment (all optional; unset, the build is exactly what `docker build .` gives real users):
#   PYTHON_IMAGE      base image instead of python:3.11-slim (deploy/podman/standins.sh makes one)
#   TORCH_WHEELHOUSE  a directory holding the CPU torch wheel, mounted into the build instead of
#                     PyTorch's CPU index
#   EXPORT_ARGS       passed to `python -m export.defaults` (e.g. "--only sst2-minilm")
# podman's settings for these machines (runc, cgroupfs, explicit ulimits): deploy/podman/containers.conf,
# unless CONTAINERS_CONF names another; host network so that pip reaches the package index.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}"
IMAGE="${1:-bert-serving:cpu}"
shift || true
# docker format: the OCI format drops HEALTHCHECK.
args=(--target cpu --format docker --network host -t "$IMAGE")
[[ -n "${PYTHON_IMAGE:-}" ]] && args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
if [[ -n "${TORCH_WHEELHOUSE:-}" ]]; then
  args+=(--volume "$(realpath "$TORCH_WHEELHOUSE"):/wheelhouse:ro" --build-arg "TORCH_PIP_ARGS=--find-links /wheelhouse")
fi
[[ -n "${EXPORT_ARGS:-}" ]] && args+=(--build-arg "EXPORT_ARGS=$EXPORT_ARGS")
exec podman build "${args[@]}" "$@" .
