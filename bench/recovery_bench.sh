#!/bin/bash
# Recovery of the CPU demo job (examples/fortunes-char.pb.txt: 2 workers, heartbeat 500 ms /
# 3 s, checkpoint every 150 steps) when one of its workers is SIGKILLed, with a third worker
# idle as the spare. Real coordinator, checkpointd and workers on 127.0.0.1.
#   bench/recovery_bench.sh [BIN_DIR]      (default build/bin)
# Prints
#   BENCH recovery detect_s=D resume_s=R lost_steps=L ...
#   detect_s: SIGKILL -> the coordinator's CONNECTION_LOST (or WORKER_LOST) event;
#   resume_s: SIGKILL -> the first step of the new generation reported;
#   lost_steps: steps done before the kill that the new generation had to redo (the kill comes
#   25 steps after the first checkpoint).
# Goals (issue 6): detect <= 2 s, resume <= 10 s.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$(cd "${1:-$ROOT/build/bin}" && pwd)
SPEC=$ROOT/examples/fortunes-char.pb.txt
[[ -r /usr/share/games/fortunes/cookie ]] || {
  echo "recovery_bench: the demo's corpus /usr/share/games/fortunes/cookie is missing (apt-get install fortunes)" >&2
  exit 2
}
WORK=${WEFT_BENCH_WORK:-$(mktemp -d /tmp/weft-recovery-bench.XXXXXX)}
mkdir -p "$WORK"
source "$ROOT/scripts/procs.sh"
weft_stop_at_exit KILL

weft_serve "$WORK/coordinator" "$BIN/weft-coordinator" --data-dir="$WORK/coordinator" \
  --metrics-address=none
weft_serve "$WORK/checkpointd" "$BIN/weft-checkpointd" --data-dir="$WORK/checkpoints" \
  --metrics-address=none

declare -A WORKER_PID
for i in 0 1 2; do
  weft_spawn "$WORK/worker$i.log" "$BIN/weft-worker" --device="cpu:$i" \
    --worker-id="bench/cpu$i" --metrics-address=none --output-dir="$WORK/models"
  WORKER_PID["bench/cpu$i"]=$WEFT_SPAWNED_PID
done

JOB=$("$BIN/trainctl" submit "$SPEC")
"$BIN/trainctl" watch "$JOB" -o json >"$WORK/watch.jsonl" 2>"$WORK/watch.err" &
WATCH=$!

# Kill one of the job's workers 25 steps after the first checkpoint.
status_field() {
  "$BIN/trainctl" status "$JOB" -o json | python3 -c "
import json, sys
s = json.load(sys.stdin)['status']
print(int(s.get('checkpoint_step', 0)), int(s.get('step', 0)), ' '.join(s.get('worker_ids', [])))"
}
while :; do
  read -r ckpt step ids < <(status_field)
  if ((ckpt > 0 && step >= ckpt + 25)); then break; fi
  sleep 0.05
done
victim=${ids%% *}
kill_time=$(python3 -c 'import time; print(time.time())')
kill -9 "${WORKER_PID[$victim]}"
echo "killed $victim at step $step (checkpoint $ckpt)" >"$WORK/kill.txt"

# Once the new generation has reported a step the measurement is complete: cancel the rest.
while ! python3 -c "
import json, sys
s = json.load(sys.stdin)['status']
sys.exit(0 if int(s.get('generation', 0)) >= 2 and int(s.get('step', 0)) > $ckpt else 1)" \
    < <("$BIN/trainctl" status "$JOB" -o json); do
  kill -0 "$WATCH" 2>/dev/null || { echo "job $JOB ended without recovering; see $WORK" >&2; exit 1; }
  sleep 0.05
done
sleep 0.5  # let watch receive that step
"$BIN/trainctl" cancel "$JOB" --reason "recovery_bench: measured" >/dev/null
wait "$WATCH" || true
"$BIN/trainctl" status "$JOB" -o json >"$WORK/final.json"
python3 - "$WORK/watch.jsonl" "$WORK/final.json" "$kill_time" "$step" <<'PY'
import json, sys
from datetime import datetime
watch, final, kill_time, kill_step = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
def ts(t):
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
status = json.load(open(final))["status"]
lost = [e for e in status["events"]
        if e["type"] in ("CONNECTION_LOST", "WORKER_LOST") and ts(e["time"]) >= kill_time]
detect = ts(lost[0]["time"]) - kill_time
first_new = None
for line in open(watch):
    s = json.loads(line)
    m = s.get("last_metrics")
    if int(s.get("generation", 0)) >= 2 and m and ts(m["time"]) > kill_time:
        if first_new is None or int(m["step"]) < int(first_new["step"]):
            first_new = m
            break
resume = ts(first_new["time"]) - kill_time
restored = int(first_new["step"]) - 1
print(f"BENCH recovery detect_s={detect:.2f} resume_s={resume:.2f} lost_steps={kill_step - restored} "
      f"killed_at_step={kill_step} restored_step={restored} restarts={status['restarts']} "
      f"detected_by={'connection' if 'lost its connection' in lost[0]['message'] else 'heartbeat_timeout'}",
      flush=True)
PY
