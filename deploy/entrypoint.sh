#!/usr/bin/env bash
# Container entrypoint for the BERT service. Settings come from the environment (the same names
# app/settings.py reads): MODELS_DIR, HOST, PORT, WORKERS, LOG_LEVEL; the app reads the rest itself
# (API_SERVERS among them: app/serve.py runs that many front ends over one engine process).
#
#   entrypoint.sh [serve] [uvicorn args...]   exec python -m app (the default; uvicorn --workers if WORKERS > 1)
#   entrypoint.sh --dry-run [uvicorn args...] print the command it would exec, then exit 0
#   entrypoint.sh healthcheck                 exit 0 when GET /health answers 200 (Docker HEALTHCHECK)
#   entrypoint.sh <command> [args...]         run any other command instead (e.g. bash)
set -euo pipefail

export MODELS_DIR="${MODELS_DIR:-/models}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8000}"
WORKERS="${WORKERS:-1}"
LOG_LEVEL="${LOG_LEVEL:-info}"
# After SIGTERM uvicorn waits this long for in-flight requests before the app's own shutdown starts:
# the app's SHUTDOWN_GRACE_S (same default), so one setting bounds the drain. Keep it below the
# orchestrator's stop timeout (compose stop_grace_period; Kubernetes terminationGracePeriodSeconds
# minus the preStop sleep); tests/deploy check both.
SHUTDOWN_GRACE_S="${SHUTDOWN_GRACE_S:-30}"

die() {
  echo "entrypoint: $*" >&2
  exit 64
}

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

healthcheck() {
  local host="$HOST"
  # A wildcard bind address is not something to connect to.
  case "$host" in 0.0.0.0 | "::" | "") host=127.0.0.1 ;; esac
  [[ "$host" == *:* ]] && host="[$host]"
  exec python3 -c '
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except Exception as error:
    print(f"healthcheck: {error}", file=sys.stderr)
    sys.exit(1)
' "http://${host}:${PORT}/health"
}

serve() {
  local dry_run="$1"
  shift
  is_uint "$PORT" && ((PORT >= 1 && PORT <= 65535)) || die "PORT must be 1-65535, got '$PORT'"
  is_uint "$WORKERS" && ((WORKERS >= 1)) || die "WORKERS must be a positive integer, got '$WORKERS'"
  local level="${LOG_LEVEL,,}"
  case "$level" in
    critical | error | warning | info | debug) ;;
    *) die "LOG_LEVEL must be one of critical, error, warning, info, debug; got '$LOG_LEVEL'" ;;
  esac
  [[ "$SHUTDOWN_GRACE_S" =~ ^([0-9]+)(\.([0-9]*))?$ ]] ||
    die "SHUTDOWN_GRACE_S must be a number of seconds >= 0, got '$SHUTDOWN_GRACE_S'"
  local grace="$((10#${BASH_REMATCH[1]}))"  # uvicorn takes whole seconds: round up
  [[ "${BASH_REMATCH[3]}" =~ [1-9] ]] && grace=$((grace + 1))
  [[ -d "$MODELS_DIR" ]] || die "MODELS_DIR '$MODELS_DIR' is not a directory (mount the bundles at /models)"

  # uvicorn's options either way: logs, proxy headers, keep-alive, the drain.
  local options=(
    --log-level "$level" --proxy-headers
    # Longer than nginx's upstream keepalive so the proxy never reuses a connection we closed.
    --timeout-keep-alive 75
    --timeout-graceful-shutdown "$grace"
  )
  local cmd
  if ((WORKERS > 1)); then
    # uvicorn's workers: each process loads every model (deploy/README.md).
    [[ "${API_SERVERS:-1}" == 1 ]] ||
      die "WORKERS=$WORKERS and API_SERVERS=$API_SERVERS do not combine: WORKERS copies every model into each process, API_SERVERS runs front ends over one engine; set one"
    local runner=(uvicorn)
    command -v uvicorn >/dev/null 2>&1 || runner=(python3 -m uvicorn)
    cmd=(
      "${runner[@]}" app.main:app --host "$HOST" --port "$PORT" --workers "$WORKERS"
      # Connection limits at the socket: header/body timeouts, header size, connections (app/api/connections.py).
      --http app.api.connections:GuardedHttp --no-server-header
      "${options[@]}" "$@"
    )
  else
    # app/serve.py: uvicorn on the connection layer (API_SERVERS=1, exec'd: this PID), or API_SERVERS
    # front ends over one engine process.
    cmd=(python3 -m app --host "$HOST" --port "$PORT" "${options[@]}" "$@")
  fi
  if [[ "$dry_run" == 1 ]]; then
    printf 'MODELS_DIR=%q' "$MODELS_DIR"
    printf ' %q' "${cmd[@]}"
    printf '\n'
    exit 0
  fi
  exec "${cmd[@]}"
}

case "${1:-serve}" in
  serve) shift $(($# > 0 ? 1 : 0)); serve "${DRY_RUN:-0}" "$@" ;;
  --dry-run) shift; serve 1 "$@" ;;
  healthcheck) healthcheck ;;
  -*) serve "${DRY_RUN:-0}" "$@" ;;
  *) exec "$@" ;;
esac
