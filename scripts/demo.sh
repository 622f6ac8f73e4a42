#!/usr/bin/env bash
# The main job: starts a coordinator on loopback, submits examples/fortunes-char.pb.txt and
# shows it through trainctl. Everything runs on the embedded defaults; state lives in .demo/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

weft_install_missing
weft_build weft-coordinator trainctl

DEMO="$WEFT_ROOT/.demo"
rm -rf "$DEMO"
mkdir -p "$DEMO"
BIN="$WEFT_BUILD/bin"

cleanup() {
  [[ -n "${COORDINATOR_PID:-}" ]] && kill "$COORDINATOR_PID" 2>/dev/null && wait "$COORDINATOR_PID" 2>/dev/null
  return 0
}
trap cleanup EXIT

weft_log "starting weft-coordinator (state in $DEMO/coordinator, log in $DEMO/coordinator.log)"
"$BIN/weft-coordinator" --listen=127.0.0.1:0 --port-file="$DEMO/coordinator.port" \
  --data-dir="$DEMO/coordinator" --metrics-address=127.0.0.1:0 \
  --metrics-port-file="$DEMO/metrics.port" >"$DEMO/coordinator.log" 2>&1 &
COORDINATOR_PID=$!
for _ in $(seq 100); do [[ -s "$DEMO/coordinator.port" ]] && break; sleep 0.1; done
[[ -s "$DEMO/coordinator.port" ]] || { cat "$DEMO/coordinator.log"; exit 1; }
export WEFT_COORDINATOR="127.0.0.1:$(cat "$DEMO/coordinator.port")"
weft_log "coordinator at $WEFT_COORDINATOR, metrics at http://127.0.0.1:$(cat "$DEMO/metrics.port")/metrics"

set -x
"$BIN/trainctl" submit "$WEFT_ROOT/examples/fortunes-char.pb.txt"
"$BIN/trainctl" list
"$BIN/trainctl" status fortunes-char-1
"$BIN/trainctl" workers
{ set +x; } 2>/dev/null

weft_log "the job is queued: it waits for 2 idle CPU workers (weft-worker is the next milestone)"
curl -s "http://127.0.0.1:$(cat "$DEMO/metrics.port")/metrics" | grep '^weft_coordinator_jobs{' || true
