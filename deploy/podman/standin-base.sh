#!/usr/bin/env bash
# A stand-in for the official python:3.11-slim, made from Debian's own packages, for machines that
# reach Debian's archive but no container registry. Real users never need it: they pull the
# official image. Bookworm's python3 is 3.11, the official image's minor version.
#
#   deploy/podman/standin-base.sh [IMAGE]     (default localhost/python-standin:3.11-slim)
#   then: podman build --build-arg PYTHON_IMAGE=localhost/python-standin:3.11-slim ...
set -euo pipefail
IMAGE="${1:-localhost/python-standin:3.11-slim}"
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
if "${PODMAN[@]}" image exists "$IMAGE"; then
  echo "standin-base: $IMAGE already exists"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# minbase: Essential packages and apt; python3-venv brings ensurepip, passwd brings useradd.
mmdebstrap --quiet --variant=minbase --include=ca-certificates,python3,python3-venv,passwd \
  bookworm "$work/rootfs.tar"
"${PODMAN[@]}" import "$work/rootfs.tar" localhost/debian-python3:bookworm
# This machine's trust store: where a proxy re-signs TLS, pip inside a build must trust what the
# host trusts (pip reads it through PIP_CERT, not its own certifi bundle).
cp /etc/ssl/certs/ca-certificates.crt "$work/host-ca.crt"
# As in the official image: `python` and `pip` first on PATH, installing into a writable prefix.
cat > "$work/Containerfile" <<'CONTAINERFILE'
FROM localhost/debian-python3:bookworm
COPY host-ca.crt /etc/ssl/certs/ca-certificates.crt
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python3 -m venv /usr/local/python && pip install -q --upgrade pip \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
CMD ["python3"]
CONTAINERFILE
"${PODMAN[@]}" build --network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
  -t "$IMAGE" -f "$work/Containerfile" "$work"
"${PODMAN[@]}" rmi localhost/debian-python3:bookworm > /dev/null
echo "standin-base: built $IMAGE"
