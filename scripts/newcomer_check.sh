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
PORT="${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]]; then kill -- -"$SERVER_PID" 2>/dev/null || kill "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== fresh clone of $REPO into $WORK (no ../shared beside it)"
git clone -q "$REPO" "$WORK/repo"
cd "$WORK/repo"

echo "== make serve (PORT=$PORT)"
started=$(date +%s)
set -m
PORT="$PORT" HOST=127.0.0.1 make serve > "$WORK/serve.log" 2>&1 &
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

post() { curl -sf "http://127.0.0.1:$PORT/$1" -H 'content-type: application/json' -d "$2"; }
check() {  # endpoint, body, python expression over `r` that must hold
  local out
  out="$(post "$1" "$2")"
  echo "POST /$1 -> $out"
  python3 -c "import json,sys; r=json.loads(sys.argv[1]); assert $3, 'unexpected answer'" "$out"
}
check classify '{"text": "A wonderful, moving film with a brilliant cast."}' 'r["label"] == "positive"'
check classify '{"text": "Dull, lifeless and far too long."}' 'r["label"] == "negative"'
check ner '{"text": "Angela Merkel met Emmanuel Macron in Paris on Tuesday."}' \
  '{"PER", "LOC"} <= {e["entity"] for e in r["entities"]} and any(e["text"] == "Paris" for e in r["entities"])'
check multiple-choice '{"context": "The child dropped the glass on the floor and it", "choices": ["shattered into pieces.", "sang a song.", "flew away like a bird.", "became a tree."]}' \
  'r["best"] == 0'
check qa '{"question": "Where is the Eiffel Tower?", "context": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was designed by the company of Gustave Eiffel."}' \
  '"Paris" in r["answers"][0]["text"]'
check embed '{"inputs": ["A man is playing a guitar.", "Someone plays an instrument."]}' \
  'len(r) == 2 and len(r[0]) == 384 and abs(sum(x * x for x in r[0]) - 1) < 1e-4'
check v1/embeddings '{"input": "A man is playing a guitar."}' \
  'r["object"] == "list" and len(r["data"][0]["embedding"]) == 384 and r["usage"]["prompt_tokens"] == 9'
check similarity '{"inputs": {"source_sentence": "A man is playing a guitar.", "sentences": ["Someone plays an instrument.", "A woman is slicing an onion."]}}' \
  'r[0] > r[1]'

if (( SKIP_TESTS == 0 )); then
  echo "== make test"
  make test
fi
echo "newcomer check passed"
