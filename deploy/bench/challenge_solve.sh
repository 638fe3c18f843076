#!/usr/bin/env bash
# deploy/bench/challenge_solve.sh — how long the sale page takes to solve the shipped
# proof-of-work difficulty in headless Chromium on this machine: SOLVES puzzles with
# random seeds, each solved by the page's own Web Worker solver (gateway/static/index.html,
# window.powBench: the same code the buy button runs), timed in the page; prints
# p50 / p90 / max and the hash rate.
#
# The page is served from gateway/static by a throw-away python3 http.server (no
# gateway, no backend: only the solver runs). chromedriver is spoken to over its HTTP
# JSON protocol with curl. Every process it starts is stopped by PID.
#
# Usage:  deploy/bench/challenge_solve.sh            (from anywhere)
# Knobs:  SOLVES=20 BITS=14 COUNT=32 (the shipped recommendation: docs/gateway.md)
#         WORKERS=<n> overrides navigator.hardwareConcurrency's cap of 4 (1 = one core)
# Needs:  chromium, chromium-driver (apt), python3, curl, jq.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SOLVES=${SOLVES:-20}
BITS=${BITS:-14}
COUNT=${COUNT:-32}
WORKERS=${WORKERS:-}
WORK=${WORK:-/tmp/challenge-solve-bench}
mkdir -p "$WORK"
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM

CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
DRIVER=$(command -v chromedriver || true)
[ -n "$CHROMIUM" ] && [ -n "$DRIVER" ] || { log "needs chromium and chromium-driver (apt-get install chromium chromium-driver)"; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(free_port); DRV_PORT=$(free_port)
python3 -m http.server "$HTTP_PORT" --bind 127.0.0.1 --directory "$ROOT/gateway/static" >"$WORK/http.log" 2>&1 &
PIDS+=($!)
"$DRIVER" --port="$DRV_PORT" >"$WORK/driver.log" 2>&1 &
PIDS+=($!)
DRV=http://127.0.0.1:$DRV_PORT
for _ in $(seq 100); do
    curl -s "$DRV/status" | jq -e '.value.ready' >/dev/null 2>&1 && break; sleep 0.1
done
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$HTTP_PORT/index.html" && break; sleep 0.1; done

PROFILE=$(mktemp -d "$WORK/profile.XXXX")
SESSION=$(curl -s -X POST "$DRV/session" -H 'Content-Type: application/json' -d "$(jq -n \
    --arg bin "$CHROMIUM" --arg prof "--user-data-dir=$PROFILE" '{capabilities: {alwaysMatch: {
      browserName: "chrome", "goog:chromeOptions": {binary: $bin, args: ["--headless", "--no-sandbox",
      "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage", $prof]}}}}')" | jq -r '.value.sessionId')
[ -n "$SESSION" ] && [ "$SESSION" != null ] || { log "no chromium session (see $WORK/driver.log)"; exit 1; }
S=$DRV/session/$SESSION
curl -s -X POST "$S/timeouts" -H 'Content-Type: application/json' -d '{"script": 3600000}' >/dev/null
curl -s -X POST "$S/url" -H 'Content-Type: application/json' -d "{\"url\": \"http://127.0.0.1:$HTTP_PORT/index.html\"}" >/dev/null
CORES=$(curl -s -X POST "$S/execute/sync" -H 'Content-Type: application/json' \
    -d '{"script": "return navigator.hardwareConcurrency", "args": []}' | jq -r '.value')
OVERRIDE=""
[ -n "$WORKERS" ] && OVERRIDE="Object.defineProperty(navigator, 'hardwareConcurrency', {get: () => $WORKERS});"
log "solving $SOLVES puzzles of $COUNT x $BITS bits in headless Chromium (cores seen: $CORES${WORKERS:+, workers forced to $WORKERS})"
T0=$(date +%s.%N)
RESULT=$(curl -s -X POST "$S/execute/async" -H 'Content-Type: application/json' -d "{\"args\": [], \"script\":
    \"const done = arguments[arguments.length - 1]; $OVERRIDE window.powBench($SOLVES, $BITS, $COUNT).then(done, (e) => done({error: String(e)}));\"}")
T1=$(date +%s.%N)
curl -s -X DELETE "$S" >/dev/null
echo "$RESULT" | jq -e '.value | type == "array"' >/dev/null || { log "the page failed: $RESULT"; exit 1; }
echo "$RESULT" | jq -r '.value[]' | python3 -c "
import sys
t = sorted(float(x) for x in sys.stdin)
n = len(t)
pct = lambda p: t[min(n - 1, max(0, round(p / 100 * n + 0.5) - 1))]
hashes = $COUNT * 2 ** $BITS
mean = sum(t) / n
print(f'challenge solve time, {n} puzzles of $COUNT x $BITS bits ({hashes} hashes expected each), headless Chromium, {\"$WORKERS\" or min(4, int(\"$CORES\"))} workers:')
print(f'  p50 {pct(50):.0f} ms   p90 {pct(90):.0f} ms   max {t[-1]:.0f} ms   mean {mean:.0f} ms')
print(f'  ~{hashes / mean * 1000 / 1e6:.2f} M hashes/s over all workers')
"
echo "reproduce: SOLVES=$SOLVES BITS=$BITS COUNT=$COUNT${WORKERS:+ WORKERS=$WORKERS} deploy/bench/challenge_solve.sh"
