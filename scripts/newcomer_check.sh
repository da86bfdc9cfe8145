#!/usr/bin/env bash
# Do exactly what a newcomer does: fresh clone in an empty temporary directory, the two
# README commands (`make serve`, `make test`), then one real request per endpoint.
#
#   bash scripts/newcomer_check.sh [--skip-tests] [REPO]   (REPO defaults to this checkout)
set -euo pipefail
SKIP_TESTS=0
if [[ "${1:-}" == "--skip-tests" ]]; then SKIP_TESTS=1; shift; fi
REPO="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
WORK="$(mktemp -d)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT="${PORT:-$(free_port)}"
GRPC_PORT="${GRPC_PORT:-$(free_port)}"
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]]; then kill -- -"$SERVER_PID" 2>/dev/null || kill "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== fresh clone of $REPO into $WORK (no ../shared beside it)"
git clone -q "$REPO" "$WORK/repo"
cd "$WORK/repo"

echo "== make serve (PORT=$PORT, GRPC_PORT=$GRPC_PORT)"
started=$(date +%s)
set -m
PORT="$PORT" GRPC_PORT="$GRPC_PORT" HOST=127.0.0.1 make serve > "$WORK/serve.log" 2>&1 &
SERVER_PID=$!
set +m
deadline=$((started + 1500))
until curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "server exited:"; tail -50 "$WORK/serve.log"; exit 1; fi
  if (( $(date +%s) > deadline )); then echo "not ready in time:"; tail -50 "$WORK/serve.log"; exit 1; fi
  sleep 2
done
echo "ready after $(( $(date +%s) - started ))s (setup + first build included)"
grep -E "^\[[0-9]/[0-9]\]|default bundles ready" "$WORK/serve.log" || true

python3 scripts/check_endpoints.py "http://127.0.0.1:$PORT"
.venv/bin/python scripts/check_grpc.py "127.0.0.1:$GRPC_PORT"  # Triton's client, from make serve's .venv

if (( SKIP_TESTS == 0 )); then
  echo "== make test"
  make test
fi
echo "newcomer check passed"
