#!/usr/bin/env bash
# The main job, from a folder of text to text out: a SentencePiece tokenizer is trained on
# Debian's fortune cookies and the text prepared into token shards (trainctl data), then a
# coordinator, a checkpointd and two CPU workers on loopback train the small GPT of
# examples/fortunes-spm.pb.txt on them, with live progress from `trainctl watch` and a
# checkpoint every 150 steps, and `trainctl sample` prints text from the trained model.
# The text, tokenizer and dataset live in /tmp/weft-fortunes (where the example spec reads
# them); the services' state in .demo/.
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

# The folder of text: every fortune file (not the .dat indexes or the .u8 links).
DATA=/tmp/weft-fortunes
rm -rf "$DATA/text"
mkdir -p "$DATA/text"
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' -exec cp -p {} "$DATA/text" \;
weft_log "training a SentencePiece tokenizer on $DATA/text (trainctl data train-tokenizer)"
"$BIN/trainctl" data train-tokenizer --out "$DATA/tokenizer.model" --vocab-size 2048 \
  --doc-separator % "$DATA/text"
weft_log "tokenizing it into token shards and a manifest (trainctl data prepare)"
"$BIN/trainctl" data prepare --out "$DATA/data" --tokenizer "$DATA/tokenizer.model" \
  --doc-separator % --val-fraction 0.02 --force "$DATA/text"

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

JOB=$("$BIN/trainctl" submit "$WEFT_ROOT/examples/fortunes-spm.pb.txt")
weft_log "submitted $JOB; following it (trainctl watch $JOB)"
"$BIN/trainctl" watch "$JOB"
"$BIN/trainctl" status "$JOB" | sed -n '1,12p'

weft_log "checkpoints (trainctl checkpoints $JOB); each commit's training stall vs. save time:"
"$BIN/trainctl" checkpoints "$JOB"
"$BIN/trainctl" status "$JOB" | grep CHECKPOINT_COMMITTED || true

weft_log "sampling text from the trained model (trainctl sample $JOB)"
for prompt in "The" "A man" "Love is"; do
  "$BIN/trainctl" sample "$JOB" --prompt "$prompt" --tokens 60 --temperature 0.8 --top-k 40
  echo
done
