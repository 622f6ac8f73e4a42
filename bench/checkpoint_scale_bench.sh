#!/bin/bash
# Checkpoints of a large model through the real services (a coordinator, weft-checkpointd,
# weft-workers, trainctl): the training stall and rank 0's upload rate per save, then a restore
# at another world size on the other device.
#
#   bench/checkpoint_scale_bench.sh BIN_DIR [DATA_FILE]
#     (a) one worker (WEFT_BENCH_DEVICE, default cuda) trains a GPT-2-style model
#     (WEFT_BENCH_SHAPE="LAYERS WIDTH HEADS VOCAB SEQ", default "48 1600 25 50304 1024": 1.5B,
#     about 18.7 GB of fp32 params + AdamW m and v) for WEFT_BENCH_STEPS steps (default 30) at
#     micro-batch WEFT_BENCH_MB (default 4), checkpointing every WEFT_BENCH_INTERVAL steps
#     (default 10); prints, from the job's SUBMITTED and CHECKPOINT_COMMITTED events,
#     BENCH checkpoint_train params=P world=1 device=D saves=K stall_ms_max=... stall_ms_mean=...
#       stall_ms_first=... upload_gbps=... copy_ms_first=... copy_ms_max_reused=... wait_ms_max=...
#       deferred=N steps_committed=...
#     upload_gbps: rank 0's bytes over its save time up to the commit, mean of the saves. A stall
#     is the copy to host memory (pinned on a GPU, into buffers prepared before training): a
#     save due while an upload is in flight is deferred until it ended (deferred counts them),
#     so wait_ms_max stays 0. The worker's log splits each stall, copy_ms_* and wait_ms_max.
#     The last save may still be uploading when the job ends: steps_committed lists the rest.
#     (b) two CPU workers resume that job (resume_from_job) for one more step at micro-batch 1
#     and a WEFT_BENCH_RESTORE_SEQ-token sequence (default 64); prints
#     BENCH checkpoint_restore from_world=1 from_device=D to_world=2 to_device=cpu restore_s=...
#       step=K
#     restore_s: the slower rank's RestoreLatest (its worker log: there is no restore event);
#     step: the checkpoint step it restored, which the job's final step (K + 1) confirms.
#   DATA_FILE: bytes to train on (DATA_FORMAT_TEXT_BYTES); default a generated text.
#   Runs on a CPU-only machine with WEFT_BENCH_DEVICE=cpu and a small WEFT_BENCH_SHAPE, e.g.
#   WEFT_BENCH_DEVICE=cpu WEFT_BENCH_SHAPE="2 64 4 256 64" WEFT_BENCH_MB=2.
#   WEFT_BENCH_WORK keeps the logs, specs and status streams (default: a fresh temporary folder);
#   it also holds checkpointd's database: at 1.5B allow 18.7 GB of disk per save (keep_last 1
#   deletes the older checkpoints, but RocksDB frees their blob files only as compaction and
#   blob garbage collection reach them).
set -euo pipefail
BIN=$(cd "${1:?bin dir}" && pwd)
DEVICE=${WEFT_BENCH_DEVICE:-cuda}
read -r L W H V T <<<"${WEFT_BENCH_SHAPE:-48 1600 25 50304 1024}"
MB=${WEFT_BENCH_MB:-4}
STEPS=${WEFT_BENCH_STEPS:-30}
INTERVAL=${WEFT_BENCH_INTERVAL:-10}
RESTORE_SEQ=${WEFT_BENCH_RESTORE_SEQ:-64}
((RESTORE_SEQ > T)) && RESTORE_SEQ=$T
WORK=${WEFT_BENCH_WORK:-$(mktemp -d /tmp/weft-ckpt-bench.XXXXXX)}
mkdir -p "$WORK"
# A kept folder from an earlier run: start from empty services.
rm -rf "$WORK/coordinator" "$WORK/checkpointd" "$WORK"/worker-*.log
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/procs.sh"
weft_stop_at_exit TERM

if [[ -n ${2:-} ]]; then
  DATA=$(readlink -f "$2")
else
  DATA=$WORK/data.txt
  python3 -c 'import sys
words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
sys.stdout.write(" ".join(words[(i * 7 + i // 5) % 8] for i in range(400000)))' >"$DATA"
fi

# spec NAME KIND WORKERS MICRO_BATCH SEQUENCE STEPS EXTRA: the model is the same in both jobs.
# A restore reads every tensor by name and element range without comparing specs, so what sizes
# a tensor must match the writer's: the architecture, layers, width, vocabulary and
# context_length (the position table is a parameter). Heads are kept equal too (they do not
# change sizes but do change the model). What only shapes a step may differ: micro-batch,
# sequence_length (up to context_length), world size, device and precision.
spec() {
  cat <<SPEC
name: "$1"
model { num_layers: $L hidden_size: $W num_heads: $H vocab_size: $V context_length: $T }
data { train_path: "$DATA" format: DATA_FORMAT_TEXT_BYTES }
optimizer { learning_rate: 3e-4 weight_decay: 0.1 grad_clip_norm: 1.0 }
lr_schedule { kind: COSINE warmup_steps: 0 min_lr_ratio: 0.1 }
training { total_steps: $6 micro_batch_size: $4 sequence_length: $5 seed: 1337 }
zero_stage: 3
resources { device_kind: DEVICE_KIND_$2 min_workers: $3 max_workers: $3 }
fault { heartbeat_interval_ms: 500 heartbeat_timeout_ms: 5000 max_restarts: 0
        stall_timeout_ms: 3600000 }
$7
SPEC
}

# start_workers PHASE KIND COUNT: logs to worker-PHASE-KIND<i>.log; sets WORKER_PIDS. CPU
# workers share the cores for their matmuls.
start_workers() {
  WORKER_PIDS=()
  local blas=$(($(nproc) / $3))
  for ((i = 0; i < $3; i++)); do
    weft_spawn "$WORK/worker-$1-$2$i.log" "$BIN/weft-worker" --device="$2:$i" \
      --checkpointd="$WEFT_CHECKPOINTD" --metrics-address=none --output-dir="$WORK/models" \
      --worker-id="ckpt-bench-$1-$2$i" --blas-threads=$((blas > 0 ? blas : 1))
    WORKER_PIDS+=("$WEFT_SPAWNED_PID")
  done
}

# run_job SPEC_FILE OUT_JSONL: submits, follows to the end (every status update), echoes the id.
run_job() { weft_run_job "$BIN/trainctl" "$1" "$2" "$WORK"/worker-*.log; }

# A coordinator per job, on the same state (the second job names the first): the first job's
# stopped worker is then never offered the second.
start_coordinator() {
  weft_serve "$WORK/coordinator" "$BIN/weft-coordinator" --data-dir="$WORK/coordinator" \
    --metrics-address=none
  COORDINATOR_PID=$WEFT_SPAWNED_PID
}

weft_serve "$WORK/checkpointd" "$BIN/weft-checkpointd" --data-dir="$WORK/checkpointd" \
  --metrics-address=none
start_coordinator
start_workers train "$DEVICE" 1
spec ckpt-train "${DEVICE^^}" 1 "$MB" "$T" "$STEPS" \
  "checkpoint { interval_steps: $INTERVAL keep_last: 1 }" >"$WORK/train.pb.txt"
TRAIN_JOB=$(run_job "$WORK/train.pb.txt" "$WORK/train.jsonl")
weft_stop "${WORKER_PIDS[@]}" "$COORDINATOR_PID"

python3 - "$WORK/train.jsonl" "$DEVICE" "$WORK/worker-train-${DEVICE}0.log" <<'PY'
import json, re, sys
path, device, log = sys.argv[1], sys.argv[2], sys.argv[3]
events = {}
for line in open(path):
    for e in json.loads(line).get("events", []):
        events[(e.get("time"), e["message"])] = e
params = None
saves = {}
unit = {"ms": 1.0, "s": 1000.0}
for e in events.values():
    m = re.match(r"submitted: (\d+) parameters", e["message"])
    if m:
        params = int(m.group(1))
    m = re.match(r"checkpoint at step (\d+) committed: training stalled ([\d.]+) (ms|s); "
                 r"rank 0 uploaded [\d.]+ [MG]B and committed in ([\d.]+) (ms|s)", e["message"])
    if m:
        saves[int(m.group(1))] = (float(m.group(2)) * unit[m.group(3)],
                                  float(m.group(4)) * unit[m.group(5)])
if params is None or not saves:
    sys.exit(f"no SUBMITTED or CHECKPOINT_COMMITTED events in {path}")
stalls = [saves[k][0] for k in sorted(saves)]
# World 1: rank 0 writes params, m and v whole, 12 bytes per parameter.
rates = [12 * params / (saves[k][1] / 1000) / 1e9 for k in sorted(saves)]
# The worker's split of each stall: waiting for the previous upload, then the copy.
# Every save is logged; the last may still be uploading when the job ends (not committed).
waits, copies, deferred = [], [], 0
logged = set()
for line in open(log):
    m = re.search(r"checkpoint at step (\d+): training stalled [\d.]+ ms \(([\d.]+) ms waiting "
                  r"for the previous upload, ([\d.]+) ms copying", line)
    if m:
        logged.add(int(m.group(1)))
        waits.append(float(m.group(2)))
        copies.append(float(m.group(3)))
    deferred += "deferred:" in line
if not set(saves) <= logged:
    sys.exit(f"checkpoints {sorted(saves)} committed but saves {sorted(logged)} logged in {log}")
print(f"BENCH checkpoint_train params={params} world=1 device={device} saves={len(saves)} "
      f"stall_ms_max={max(stalls):.1f} stall_ms_mean={sum(stalls) / len(stalls):.1f} "
      f"stall_ms_first={stalls[0]:.1f} upload_gbps={sum(rates) / len(rates):.3f} "
      f"copy_ms_first={copies[0]:.1f} copy_ms_max_reused={max(copies[1:], default=0):.1f} "
      f"wait_ms_max={max(waits):.1f} deferred={deferred} "
      f"steps_committed={','.join(str(k) for k in sorted(saves))}",
      flush=True)
PY

# (b) The newest checkpoint's step, then one more step from it on two CPU workers.
CKPT_STEP=$(python3 -c 'import json, sys
print(max(int(json.loads(l).get("checkpoint_step", 0)) for l in open(sys.argv[1])))' \
  "$WORK/train.jsonl")
start_coordinator
start_workers restore cpu 2
spec ckpt-restore CPU 2 1 "$RESTORE_SEQ" $((CKPT_STEP + 1)) \
  "resume_from_job: \"$TRAIN_JOB\"" >"$WORK/restore.pb.txt"
run_job "$WORK/restore.pb.txt" "$WORK/restore.jsonl" >/dev/null
weft_stop "${WORKER_PIDS[@]}" "$COORDINATOR_PID"

python3 - "$WORK/restore.jsonl" "$DEVICE" "$TRAIN_JOB" "$WORK"/worker-restore-*.log <<'PY'
import json, re, sys
path, device, source = sys.argv[1], sys.argv[2], sys.argv[3]
restores = []
for log in sys.argv[4:]:
    for line in open(log):
        m = re.search(r"restored checkpoint (\S+) step (\d+) in ([\d.]+) s", line)
        if m:
            restores.append((m.group(1), int(m.group(2)), float(m.group(3))))
if len(restores) != 2 or any(r[0] != source for r in restores):
    sys.exit(f"expected both ranks to restore {source}, found {restores}")
step = restores[0][1]
final = max(int(json.loads(l).get("step", 0)) for l in open(path))
if any(r[1] != step for r in restores) or final != step + 1:
    sys.exit(f"ranks restored {restores}, the job ended at step {final}")
print(f"BENCH checkpoint_restore from_world=1 from_device={device} to_world=2 to_device=cpu "
      f"restore_s={max(r[2] for r in restores):.2f} step={step}", flush=True)
PY
