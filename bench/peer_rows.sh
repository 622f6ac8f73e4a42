#!/bin/bash
# Issue 17's comparison rows: Weft through the real services (bench/gpu_train_bench.sh) and
# the PyTorch peer (../shared/bench/peer_fsdp_gpt.py under torchrun; for the Qwen3 and Mistral
# rows bench/peers/peer_fsdp_families.py) on the same GPUs, in one call, so a lease of 4 or 8
# GPUs turns into figures without hand-assembled commands.
#
#   bench/peer_rows.sh ROW BIN_DIR DATA_FILE PEER_SCRIPT "GPU counts"
#
# PEER_SCRIPT is peer_fsdp_gpt.py; qwen3-8b and mistral-7b run this repository's
# bench/peers/peer_fsdp_families.py whatever it names (pass it anyway, or "-").
#
# ROW:
#   gpt2-124m  GPT-2 124M, micro-batch 16: Weft (AUTO), FSDP2 + compile and DDP + compile at
#              each count. Summary per count: speed against both, and each one's scaling
#              efficiency against its own 1-GPU figure when 1 is among the counts.
#   gpt-6.7b   32 x 4096, 32 heads, vocab 50304, T 1024, micro-batch 8.
#   llama-8b   32 x 4096, 32 / 8 heads, SwiGLU 14336, vocab 128,256, T 4096, micro-batch 2.
#   qwen3-8b   Qwen3 8B: 36 x 4096, 32 / 8 heads of 128, q/k RMSNorm, SwiGLU 12288, vocab
#              151,936, untied, rope_theta 1e6, T 4096, micro-batch 2: llama-8b's 8192 tokens
#              per GPU step, so the two rows compare, and it fits the peer from 2 GPUs up (by
#              estimate about 80 GiB at 2, 50 at 4, 35 at 8: the fp32 weights and AdamW state,
#              16 bytes a parameter, 122 GiB over the GPUs, plus about 20 GiB, most of it two
#              rows of 151,936 logits in bf16 and fp32 with their gradients). On 1 GPU those
#              122 GiB leave too little of an H200 for micro-batch 2 (llama-8b's peer peaked at
#              123.6 GiB there with 8.0B parameters and a smaller vocabulary).
#   mistral-7b Mistral 7B (v0.3 vocabulary and rope_theta 1e6) at long context: 32 x 4096,
#              32 / 8 heads, SwiGLU 14336, vocab 32,768, untied, T 16384 with a sliding window
#              of 4096 (the peer's attention: FlexAttention with a sliding-window BlockMask),
#              micro-batch 1; 20 Weft steps and 5 + 15 peer steps, as a step takes about 2.6
#              times llama-8b's. 2 GPUs or more.
#              For these four, at each count: Weft FULL against the peer with activation
#              checkpointing (like for like), then Weft AUTO with training.device_memory_limit_gib
#              set to the peer's max_memory_allocated plus the 1.5 GiB NCCL/runtime reserve the
#              limit counts (Weft's best plan within the peer's memory). The MFUs of both sides
#              count a window as full causal attention (peer_fsdp_families.py's docstring).
#   llama-70b  80 x 8192, 64 / 8 heads, SwiGLU 28672, vocab 128,256, T 4096, micro-batch 1:
#              Weft FULL with optimizer.offload_auto, the peer with activation checkpointing
#              (and, if that fails, with --offload as well).
#
# Prints every BENCH gpu_train and RESULT line, then per count
#   BENCH peer_row row=R gpus=G weft_tok_s_per_gpu=.. peer_tok_s_per_gpu=.. speed_ratio=..
#     weft_gib=.. peer_gib=.. memory_ratio=.. [auto_tok_s_per_gpu=.. auto_speed_ratio=..
#     auto_gib=.. auto_plan=..]
# (gpt2-124m: fsdp_/ddp_ figures and scaling_ efficiencies instead). A run that fails prints
# its log's tail and the row goes on with the rest; its figures read "failed".
# WEFT_BENCH_STEPS overrides the rows' step counts, WEFT_PEER_ROWS_LAYERS their layer counts;
# everything else gpu_train_bench.sh reads (WEFT_BENCH_WORK, ...) passes through.
set -euo pipefail
ROW=${1:?row: gpt2-124m, gpt-6.7b, llama-8b, llama-70b, qwen3-8b or mistral-7b}
BIN=$(cd "${2:?bin dir}" && pwd)
DATA=$(readlink -f "${3:?data file}")
PEER=${4:?peer script (peer_fsdp_gpt.py)}
COUNTS=${5:?GPU counts, e.g. \"4 8\"}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOGS=$(mktemp -d /tmp/weft-peer-rows.XXXXXX)

case "$ROW" in
  gpt2-124m) arch=gpt2; shape=""; mb=16; steps=60
    peer_shape=(--layers 12 --dim 768 --heads 12 --vocab 50304 --seq 1024 --mb 16) ;;
  gpt-6.7b) arch=gpt2; shape="32 4096 32 50304 1024"; mb=8; steps=30
    peer_shape=(--layers 32 --dim 4096 --heads 32 --vocab 50304 --seq 1024 --mb 8) ;;
  llama-8b) arch=llama; shape="32 4096 32 8 14336 128256 4096"; mb=2; steps=30
    peer_shape=(--arch llama --layers 32 --dim 4096 --heads 32 --kv-heads 8 --ffn 14336
                --vocab 128256 --seq 4096 --mb 2) ;;
  # Few steps: at 70B a step takes seconds (minutes for the peer with its optimizer on the
  # CPU), and a device call has 10 minutes.
  llama-70b) arch=llama; shape="80 8192 64 8 28672 128256 4096"; mb=1; steps=12
    peer_shape=(--arch llama --layers 80 --dim 8192 --heads 64 --kv-heads 8 --ffn 28672
                --vocab 128256 --seq 4096 --mb 1 --steps 8 --warmup 3) ;;
  # The families peer lives in this repository; peer_fsdp_gpt.py knows neither family.
  qwen3-8b) arch=qwen3; shape="36 4096 32 8 12288 151936 4096 128 0"; mb=2; steps=30
    PEER=$HERE/peers/peer_fsdp_families.py
    peer_shape=(--arch qwen3 --layers 36 --dim 4096 --heads 32 --kv-heads 8 --head-dim 128
                --ffn 12288 --vocab 151936 --seq 4096 --rope-theta 1000000 --mb 2) ;;
  mistral-7b) arch=mistral; shape="32 4096 32 8 14336 32768 16384 128 4096"; mb=1; steps=20
    PEER=$HERE/peers/peer_fsdp_families.py
    peer_shape=(--arch mistral --layers 32 --dim 4096 --heads 32 --kv-heads 8 --ffn 14336
                --vocab 32768 --seq 16384 --window 4096 --rope-theta 1000000 --mb 1
                --steps 15 --warmup 5) ;;
  *) echo "peer_rows: unknown row '$ROW' (gpt2-124m, gpt-6.7b, llama-8b, llama-70b, qwen3-8b," \
       "mistral-7b)" >&2
     exit 2 ;;
esac
PEER=$(readlink -f "$PEER")
[[ -f "$PEER" ]] || { echo "peer_rows: no peer script at $PEER" >&2; exit 2; }
steps=${WEFT_BENCH_STEPS:-$steps}
# WEFT_PEER_ROWS_LAYERS cuts both models to that many layers (a row's width on fewer GPUs).
if [[ -n "${WEFT_PEER_ROWS_LAYERS:-}" ]]; then
  layers=$WEFT_PEER_ROWS_LAYERS
  [[ "$layers" =~ ^[1-9][0-9]*$ ]] || { echo "peer_rows: WEFT_PEER_ROWS_LAYERS='$layers' is not a positive integer" >&2; exit 2; }
  if [[ -n "$shape" ]]; then shape="$layers ${shape#* }"; else shape="$layers 768 12 50304 1024"; fi
  for i in "${!peer_shape[@]}"; do
    if [[ "${peer_shape[$i]}" == --layers ]]; then peer_shape[i + 1]=$layers; fi
  done
fi

# field NAME LINE: NAME=value from a BENCH or RESULT line, thousands separators dropped.
field() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" <<<"$2" | tr -d ','; }
# ratio A B: A / B to 3 places, or "failed" when either is missing.
ratio() {
  if [[ -z "$1" || -z "$2" ]]; then echo failed; return; fi
  awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }'
}
or_failed() { if [[ -n "$1" ]]; then echo "$1"; else echo failed; fi; }

# weft NAME GPUS [ENV=VALUE ...]: one gpu_train line (empty on failure).
weft() {
  local name=$1 gpus=$2; shift 2
  local log="$LOGS/weft-$name-$gpus.log"
  if env WEFT_BENCH_SHAPE="$shape" WEFT_BENCH_MB="$mb" WEFT_BENCH_STEPS="$steps" "$@" \
      bash "$HERE/gpu_train_bench.sh" throughput "$BIN" "$DATA" "$gpus" "$arch" >"$log" 2>&1; then
    grep -m1 '^BENCH gpu_train' "$log" || true
  else
    echo "peer_rows: Weft $name on $gpus GPUs failed; the log's tail:" >&2
    tail -n 15 "$log" >&2
  fi
}

# peer NAME GPUS ARGS...: the peer's RESULT line (empty on failure).
peer() {
  local name=$1 gpus=$2; shift 2
  local log="$LOGS/peer-$name-$gpus.log"
  if (cd "$(dirname "$PEER")" && torchrun --standalone --nproc_per_node="$gpus" "$PEER" "$@" \
      "${peer_shape[@]}") >"$log" 2>&1; then
    grep -m1 '^RESULT' "$log" || true
  else
    echo "peer_rows: the peer ($name) on $gpus GPUs failed; the log's tail:" >&2
    tail -n 15 "$log" >&2
  fi
}

declare -A scale_base=()
for g in $COUNTS; do
  if [[ "$ROW" == gpt2-124m ]]; then
    w=$(weft auto "$g")
    f=$(peer fsdp "$g" --mode fsdp --compile)
    d=$(peer ddp "$g" --mode ddp --compile)
    printf '%s\n' "$w" "$f" "$d" | sed '/^$/d'
    wt=$(field tokens_per_s_per_gpu "$w"); ft=$(field tok_s_per_gpu "$f")
    dt=$(field tok_s_per_gpu "$d")
    scaling=""
    if [[ "$g" == 1 ]]; then scale_base=([w]="$wt" [f]="$ft" [d]="$dt"); fi
    if [[ -n "${scale_base[w]:-}" ]]; then
      scaling=" scaling_weft=$(ratio "$wt" "${scale_base[w]}") scaling_fsdp=$(ratio "$ft" "${scale_base[f]}") scaling_ddp=$(ratio "$dt" "${scale_base[d]}")"
    fi
    echo "BENCH peer_row row=$ROW gpus=$g weft_tok_s_per_gpu=$(or_failed "$wt")" \
      "fsdp_tok_s_per_gpu=$(or_failed "$ft") ddp_tok_s_per_gpu=$(or_failed "$dt")" \
      "vs_fsdp=$(ratio "$wt" "$ft") vs_ddp=$(ratio "$wt" "$dt")" \
      "weft_gib=$(or_failed "$(field peak_mem_gib "$w")") fsdp_gib=$(or_failed "$(field maxmem_GiB "$f")")" \
      "ddp_gib=$(or_failed "$(field maxmem_GiB "$d")")$scaling"
    continue
  fi
  if [[ "$ROW" == llama-70b ]]; then
    w=$(weft full-offload "$g" WEFT_BENCH_AC=FULL WEFT_BENCH_OFFLOAD=auto)
    p=$(peer ac "$g" --mode fsdp --compile --ac)
    [[ -n "$p" ]] || p=$(peer ac-offload "$g" --mode fsdp --compile --ac --offload)
  else
    w=$(weft full "$g" WEFT_BENCH_AC=FULL)
    p=$(peer ac "$g" --mode fsdp --compile --ac)
  fi
  printf '%s\n' "$w" "$p" | sed '/^$/d'
  wt=$(field tokens_per_s_per_gpu "$w"); wm=$(field peak_mem_gib "$w")
  pt=$(field tok_s_per_gpu "$p"); pm=$(field maxmem_GiB "$p")
  auto=""
  if [[ "$ROW" != llama-70b && -n "$pm" ]]; then
    limit=$(awk -v m="$pm" 'BEGIN { printf "%.2f", m + 1.5 }')
    a=$(weft auto "$g" WEFT_BENCH_AC=AUTO WEFT_BENCH_MEMORY_LIMIT_GIB="$limit")
    [[ -z "$a" ]] || echo "$a"
    at=$(field tokens_per_s_per_gpu "$a")
    auto=" auto_tok_s_per_gpu=$(or_failed "$at") auto_speed_ratio=$(ratio "$at" "$pt") auto_gib=$(or_failed "$(field peak_mem_gib "$a")") auto_plan=$(or_failed "$(field activation_checkpointing "$a")")"
  fi
  echo "BENCH peer_row row=$ROW gpus=$g weft_tok_s_per_gpu=$(or_failed "$wt")" \
    "peer_tok_s_per_gpu=$(or_failed "$pt") speed_ratio=$(ratio "$wt" "$pt")" \
    "weft_gib=$(or_failed "$wm") peer_gib=$(or_failed "$pm") memory_ratio=$(ratio "$wm" "$pm")$auto"
done
echo "peer_rows: logs in $LOGS" >&2
