#!/usr/bin/env bash
# Supervised fine-tuning end to end: a Hugging Face model and chat conversations in, a
# fine-tuned Hugging Face model out (README.md here says more).
#
#   examples/sft/sft.sh [HF_DIR [CONVERSATIONS.jsonl]]
#
#  1. HF_DIR (config.json, safetensors, tokenizer.json) is the model to fine-tune; without it, a
#     tiny random Llama with a ChatML tokenizer is made for the example (make_tiny_llama.py).
#  2. `trainctl data prepare --chat` renders the conversations (default: conversations.jsonl
#     here, arithmetic questions and answers) with the chat template and tokenizes them, with a
#     loss mask: only the assistant's answers are targets. 10% are held out for validation.
#  3. A CPU job (two workers, ZeRO-3) starts from HF_DIR's weights (init_from_hf_dir) and
#     trains on whole conversations packed into windows (sampling PACKED), each attending only
#     to itself (document_masking) with positions from 0 (reset_positions), validating on the
#     held-out conversations.
#  4. The trained model is exported as a Hugging Face directory (fp32, tokenizer included).
#  5. With WEFT_TRANSFORMERS_PYTHON (a python with torch and transformers), transformers
#     computes the loss of the exported model on exactly the rows Weft validated on
#     (`trainctl data batches`, tests/fixtures/hf/masked_loss.py) and it must match Weft's
#     final validation loss to 1e-4 (relative).
#
# Environment:
#   WEFT_BIN          Weft's programs (default: build/bin of this checkout)
#   SFT_WORK          the working folder, replaced on every run (default: /tmp/weft-sft)
#   SFT_STEPS         optimizer steps (default: 150)
#   SFT_TEMPLATE      HF_DIR's chat template: chatml, llama3, llama3.1 or mistral (default:
#                     chatml)
#   SFT_LR            peak learning rate (default: 3e-3, for the random model; a real
#                     checkpoint wants about 1e-5)
#   SFT_SEQUENCE_LENGTH  tokens a window (default: 128); the longest conversations should fit
#   SFT_COORDINATOR   HOST:PORT of a running coordinator whose CPU workers (at least two) see
#                     SFT_WORK: submit there instead of starting a coordinator and two workers
#   WEFT_TRANSFORMERS_PYTHON  see step 5; without it that check is skipped, saying so
#
# Results in SFT_WORK: job.pb.txt (the spec submitted), job-id, watch.jsonl (every status
# `trainctl watch` saw), status.json (the finished job), hf/ (the export), val-batch.json
# (the validation rows), and the last line printed:
#   SFT job=<id> first_loss=<x> final_loss=<x> val_loss=<x> [transformers_val_loss=<x> rel=<x>]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$(cd "${WEFT_BIN:-$ROOT/build/bin}" && pwd)
WORK=${SFT_WORK:-/tmp/weft-sft}
STEPS=${SFT_STEPS:-150}
TEMPLATE=${SFT_TEMPLATE:-chatml}
LR=${SFT_LR:-3e-3}
SEQUENCE_LENGTH=${SFT_SEQUENCE_LENGTH:-128}
CONVERSATIONS=$(realpath "${2:-$HERE/conversations.jsonl}")
source "$ROOT/scripts/procs.sh"
say() { printf '\033[1m[sft]\033[0m %s\n' "$*" >&2; }
fail() {
  echo "sft.sh: $*" >&2
  for f in "$WORK"/*.log; do [[ -f $f ]] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
  exit 1
}
trainctl() { "$BIN/trainctl" "$@"; }
# A field of a JSON file, by a Python expression on `j` (python3's standard library only).
json_field() { python3 -c "import json, sys; j = json.load(open(sys.argv[1])); print($2)" "$1"; }

rm -rf "$WORK"
mkdir -p "$WORK"

# 1. The model.
if [[ $# -ge 1 ]]; then
  MODEL=$(realpath "$1")
else
  MODEL=$WORK/model
  say "making a tiny random Llama in $MODEL (make_tiny_llama.py)"
  python3 "$HERE/make_tiny_llama.py" --out "$MODEL" \
    --tokenizer "$ROOT/tests/fixtures/chat/chatml.tokenizer.json" >&2
fi
[[ -f $MODEL/tokenizer.json ]] || fail "$MODEL has no tokenizer.json (the chat data needs it)"

# 2. The data: token shards, their loss masks and conversation starts, and a manifest.
say "preparing $CONVERSATIONS with the $TEMPLATE template (trainctl data prepare --chat)"
trainctl data prepare --chat --template "$TEMPLATE" --tokenizer "$MODEL/tokenizer.json" \
  --val-fraction 0.1 --quiet --out "$WORK/data" "$CONVERSATIONS" >&2

# 3. The job: the model block (and init_from_hf_dir) as `trainctl model from-hf` derives it
# from config.json, then the fine-tuning. A window of 128 tokens holds one or two of the
# example's conversations (50 to 100 tokens each); PACKED fills each window with whole ones.
{
  trainctl model from-hf "$MODEL" | grep -v '^#'
  cat <<SPEC
name: "sft"
data {
  manifest_path: "$WORK/data"
  sampling: PACKED
  document_masking: true
  reset_positions: true
}
optimizer { learning_rate: $LR weight_decay: 0.0 grad_clip_norm: 1.0 }
lr_schedule { kind: COSINE warmup_steps: $((STEPS < 50 ? STEPS / 5 : 10)) min_lr_ratio: 0.1 }
training {
  total_steps: $STEPS
  micro_batch_size: 4
  sequence_length: $SEQUENCE_LENGTH
  val_interval_steps: 25
  val_batches: 2
  seed: 1
}
zero_stage: 3
resources { device_kind: DEVICE_KIND_CPU min_workers: 2 max_workers: 2 }
SPEC
} >"$WORK/job.pb.txt"

if [[ -n ${SFT_COORDINATOR:-} ]]; then
  export WEFT_COORDINATOR=$SFT_COORDINATOR
else
  say "starting a coordinator and two CPU workers (logs in $WORK)"
  weft_stop_at_exit TERM
  weft_serve "$WORK/coordinator" "$BIN/weft-coordinator" --data-dir="$WORK/coordinator" \
    --metrics-address=none || fail "weft-coordinator did not start"
  for i in 0 1; do
    weft_spawn "$WORK/worker$i.log" "$BIN/weft-worker" --device="cpu:$i" --checkpointd=none \
      --metrics-address=none --output-dir="$WORK/models"
  done
fi
JOB=$(trainctl submit "$WORK/job.pb.txt") || fail "submit refused $WORK/job.pb.txt"
echo "$JOB" >"$WORK/job-id"
say "training $JOB: $STEPS steps (trainctl watch $JOB)"
trainctl watch "$JOB" -o json >"$WORK/watch.jsonl" || fail "job $JOB did not succeed"
trainctl status "$JOB" -o json >"$WORK/status.json"

# 4. The fine-tuned model for transformers.
trainctl model export "$JOB" --out "$WORK/hf" --dtype fp32 >&2

FIRST=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line).get("last_metrics", {})
    if int(m.get("step", 0)) > 0:
        print(m["loss"]); break' "$WORK/watch.jsonl")
FINAL=$(json_field "$WORK/status.json" 'j["status"]["last_metrics"]["loss"]')
VAL=$(json_field "$WORK/status.json" 'j["status"]["last_metrics"]["val_loss"]')
say "training loss $FIRST at the first step seen, $FINAL at the last; validation loss $VAL"
RESULT="SFT job=$JOB first_loss=$FIRST final_loss=$FINAL val_loss=$VAL"

# 5. The held-out check: the rows every rank validated on, scored by transformers.
trainctl data batches "$WORK/job.pb.txt" --split val >"$WORK/val-batch.json"
if [[ -z ${WEFT_TRANSFORMERS_PYTHON:-} ]]; then
  say "WEFT_TRANSFORMERS_PYTHON is not set: not checking the export with transformers"
  echo "$RESULT"
  exit 0
fi
OUT=$("$WEFT_TRANSFORMERS_PYTHON" "$ROOT/tests/fixtures/hf/masked_loss.py" "$WORK/hf" \
  "$WORK/val-batch.json") || fail "masked_loss.py failed: $OUT"
HF=$(sed -n 's/^masked_loss=\([^ ]*\) .*/\1/p' <<<"$OUT")
REL=$(awk -v a="$HF" -v b="$VAL" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
  printf "%.3g", d / m }')
echo "$RESULT transformers_val_loss=$HF rel=$REL"
awk -v r="$REL" 'BEGIN { exit !(r <= 1e-4) }' ||
  fail "transformers' loss on the validation rows, $HF, is not Weft's $VAL (relative $REL > 1e-4)"
say "transformers agrees: $HF on the same rows (relative difference $REL)"
