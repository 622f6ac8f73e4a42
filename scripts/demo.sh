#!/usr/bin/env bash
# The main job: a coordinator, a checkpointd and two CPU workers on loopback train the
# character-level GPT of examples/fortunes-char.pb.txt on Debian's fortune cookies, with live
# progress from `trainctl watch` and a checkpoint every 150 steps, then print text sampled
# from the trained model. State lives in .demo/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/procs.sh"

weft_install_missing
weft_build weft-coordinator weft-checkpointd weft-worker trainctl

DEMO="$WEFT_ROOT/.demo"
rm -rf "$DEMO"
mkdir -p "$DEMO"
BIN="$WEFT_BUILD/bin"
weft_stop_at_exit TERM

weft_log "starting weft-coordinator (log: .demo/coordinator.log)"
weft_serve "$DEMO/coordinator" "$BIN/weft-coordinator" --data-dir="$DEMO/coordinator" \
  --metrics-address=127.0.0.1:0 --metrics-port-file="$DEMO/coordinator-metrics.port"

weft_log "starting weft-checkpointd (checkpoints in .demo/checkpoints, log: .demo/checkpointd.log)"
weft_serve "$DEMO/checkpointd" "$BIN/weft-checkpointd" --data-dir="$DEMO/checkpoints" \
  --metrics-address=127.0.0.1:0 --metrics-port-file="$DEMO/checkpointd-metrics.port"

for i in 0 1; do
  weft_log "starting weft-worker cpu:$i (log: .demo/worker$i.log)"
  weft_spawn "$DEMO/worker$i.log" "$BIN/weft-worker" --device="cpu:$i" \
    --output-dir="$DEMO/models" --metrics-port-file="$DEMO/worker$i-metrics.port"
done
for i in 0 1; do weft_wait_for_file "$DEMO/worker$i-metrics.port"; done
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
