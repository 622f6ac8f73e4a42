#!/usr/bin/env bash
# The main job: a coordinator, a checkpointd and two CPU workers on loopback train the
# character-level GPT of examples/fortunes-char.pb.txt on Debian's fortune cookies, with live
# progress from `trainctl watch` and a checkpoint every 150 steps, then print text sampled
# from the trained model. State lives in .demo/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

weft_install_missing
weft_build weft-coordinator weft-checkpointd weft-worker trainctl

DEMO="$WEFT_ROOT/.demo"
rm -rf "$DEMO"
mkdir -p "$DEMO"
BIN="$WEFT_BUILD/bin"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_for_file() {
  for _ in $(seq 200); do [[ -s "$1" ]] && return 0; sleep 0.05; done
  echo "timed out waiting for $1" >&2
  return 1
}

weft_log "starting weft-coordinator (log: .demo/coordinator.log)"
"$BIN/weft-coordinator" --listen=127.0.0.1:0 --port-file="$DEMO/coordinator.port" \
  --data-dir="$DEMO/coordinator" --metrics-address=127.0.0.1:0 \
  --metrics-port-file="$DEMO/coordinator-metrics.port" >"$DEMO/coordinator.log" 2>&1 &
PIDS+=($!)
wait_for_file "$DEMO/coordinator.port" || { cat "$DEMO/coordinator.log"; exit 1; }
export WEFT_COORDINATOR="127.0.0.1:$(cat "$DEMO/coordinator.port")"

weft_log "starting weft-checkpointd (checkpoints in .demo/checkpoints, log: .demo/checkpointd.log)"
"$BIN/weft-checkpointd" --listen=127.0.0.1:0 --port-file="$DEMO/checkpointd.port" \
  --data-dir="$DEMO/checkpoints" --metrics-address=127.0.0.1:0 \
  --metrics-port-file="$DEMO/checkpointd-metrics.port" >"$DEMO/checkpointd.log" 2>&1 &
PIDS+=($!)
wait_for_file "$DEMO/checkpointd.port" || { cat "$DEMO/checkpointd.log"; exit 1; }
export WEFT_CHECKPOINTD="127.0.0.1:$(cat "$DEMO/checkpointd.port")"

for i in 0 1; do
  weft_log "starting weft-worker cpu:$i (log: .demo/worker$i.log)"
  "$BIN/weft-worker" --device="cpu:$i" --output-dir="$DEMO/models" \
    --metrics-port-file="$DEMO/worker$i-metrics.port" >"$DEMO/worker$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1; do wait_for_file "$DEMO/worker$i-metrics.port"; done
weft_log "coordinator $WEFT_COORDINATOR; metrics: coordinator :$(cat "$DEMO/coordinator-metrics.port"), workers :$(cat "$DEMO/worker0-metrics.port") :$(cat "$DEMO/worker1-metrics.port")"

JOB=$("$BIN/trainctl" submit "$WEFT_ROOT/examples/fortunes-char.pb.txt")
weft_log "submitted $JOB; following it (trainctl watch $JOB)"
"$BIN/trainctl" watch "$JOB"
"$BIN/trainctl" status "$JOB" | sed -n '1,12p'

weft_log "checkpoints (trainctl checkpoints $JOB); each commit's training stall vs. save time:"
"$BIN/trainctl" checkpoints "$JOB"
"$BIN/trainctl" status "$JOB" | grep CHECKPOINT_COMMITTED || true

weft_log "sampling from the trained model (trainctl sample $JOB)"
"$BIN/trainctl" sample "$JOB" --prompt "The " --tokens 300 --temperature 0.8 --top-k 20
