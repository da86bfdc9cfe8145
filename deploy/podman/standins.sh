#!/usr/bin/env bash
# Stand-ins for the official images the Dockerfile and the compose file name, made from Debian's own
# packages, for machines that reach Debian's archive but no container registry (our development
# machines). Real users never need them: they pull the official images.
#
#   deploy/podman/standins.sh [python|nginx|prometheus|all]      (default: python)
#
#   python      localhost/python-standin:3.11-slim   for python:3.11-slim (bookworm's python3 is 3.11)
#   nginx       localhost/nginx-standin:latest       for nginx:1.28-alpine (sid's nginx: `server ... resolve`
#               needs 1.27.3+), with the official image's template step (local resolvers, envsubst)
#   prometheus  localhost/prometheus-standin:latest  for prom/prometheus
set -euo pipefail
# podman's settings for these machines: ../shared/notes/containers.md.
export CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "$0")" && pwd)/containers.conf}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# rootfs IMAGE SUITE PACKAGES: a minbase Debian with PACKAGES, imported as IMAGE.
rootfs() {
  # sid's snapshot on the mirror may carry an expired Release date.
  mmdebstrap --quiet --variant=minbase --aptopt='Acquire::Check-Valid-Until "false"' \
    --include="$3" "$2" "$work/$1.tar"
  podman import "$work/$1.tar" "localhost/$1:rootfs"
  rm -f "$work/$1.tar"
}

# This machine's trust store: where a proxy re-signs TLS, pip inside a build must trust what the
# host trusts (pip reads it through PIP_CERT, not its own certifi bundle).
python_standin() {
  cp /etc/ssl/certs/ca-certificates.crt "$work/host-ca.crt"
  rootfs debian-python bookworm ca-certificates,python3,python3-venv,passwd
  # As in the official image: `python` and `pip` first on PATH, installing into a writable prefix.
  cat > "$work/Containerfile" <<'CONTAINERFILE'
FROM localhost/debian-python:rootfs
COPY host-ca.crt /etc/ssl/certs/ca-certificates.crt
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python3 -m venv /usr/local/python && pip install -q --upgrade pip \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
CMD ["python3"]
CONTAINERFILE
}

nginx_standin() {
  rootfs debian-nginx sid nginx,wget,gettext-base
  # The official image's /docker-entrypoint.sh, the parts compose relies on: NGINX_LOCAL_RESOLVERS
  # from /etc/resolv.conf, then *.template files rendered with envsubst (defined variables only).
  # One difference: only the first nameserver. podman before 4.5 lists the host's servers after the
  # network's own (aardvark), and nginx asks each in turn: the host's do not know the replicas.
  # Docker and newer podman list the network's server alone, so there both read the same.
  cat > "$work/entrypoint.sh" <<'ENTRYPOINT'
#!/bin/sh
set -eu
if [ -n "${NGINX_ENTRYPOINT_LOCAL_RESOLVERS:-}" ]; then
  NGINX_LOCAL_RESOLVERS=$(awk '/^nameserver/ { if ($2 ~ ":") print "[" $2 "]"; else print $2; exit }' /etc/resolv.conf)
  export NGINX_LOCAL_RESOLVERS
fi
out="${NGINX_ENVSUBST_OUTPUT_DIR:-/etc/nginx/conf.d}"
defined=$(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/${\1}/p' | tr '\n' ' ')
for template in /etc/nginx/templates/*.template; do
  [ -e "$template" ] || continue
  envsubst "$defined" < "$template" > "$out/$(basename "$template" .template)"
done
exec "$@"
ENTRYPOINT
  cat > "$work/Containerfile" <<'CONTAINERFILE'
FROM localhost/debian-nginx:rootfs
COPY --chmod=755 entrypoint.sh /docker-entrypoint.sh
RUN mkdir -p /etc/nginx/templates && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
EXPOSE 80
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/docker-entrypoint.sh"]
CMD ["nginx", "-g", "daemon off;"]
CONTAINERFILE
}

prometheus_standin() {
  rootfs debian-prometheus sid prometheus,ca-certificates
  cat > "$work/Containerfile" <<'CONTAINERFILE'
FROM localhost/debian-prometheus:rootfs
RUN mkdir -p /prometheus && chown nobody:nogroup /prometheus && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
CONTAINERFILE
}

build_standin() {  # build_standin NAME IMAGE
  if podman image exists "$2"; then
    echo "standins: $2 already exists"
    return
  fi
  rm -f "$work"/*
  "${1}_standin"
  podman build --network host -t "$2" -f "$work/Containerfile" "$work"
  podman rmi "localhost/debian-$1:rootfs" > /dev/null
  echo "standins: built $2"
}

case "${1:-python}" in
  python) build_standin python localhost/python-standin:3.11-slim ;;
  nginx) build_standin nginx localhost/nginx-standin:latest ;;
  prometheus) build_standin prometheus localhost/prometheus-standin:latest ;;
  all)
    build_standin python localhost/python-standin:3.11-slim
    build_standin nginx localhost/nginx-standin:latest
    build_standin prometheus localhost/prometheus-standin:latest
    ;;
  *) echo "usage: $0 [python|nginx|prometheus|all]" >&2; exit 64 ;;
esac
