#!/bin/bash
# GPU training through the real services: a coordinator, one weft-worker per GPU
# (--device cuda:K), a job submitted with trainctl and followed with `trainctl watch -o json`.
#
#   bench/gpu_train_bench.sh throughput BIN_DIR DATA_FILE "1 2 4" [gpt2|llama|qwen2|qwen3|mistral]
#     gpt2 (the default): GPT-2 124M (12 layers, 768 wide, 12 heads, vocab 50304, context 1024),
#     micro-batch 16 per GPU; llama: Llama-3.2-1B-like (16 layers, 2048 wide, 32 heads / 8 kv
#     heads, SwiGLU 8192, vocab 128,256, untied head, rope_theta 500000, context 2048),
#     micro-batch 8 per GPU (the shape of ../shared/bench/peer_fsdp_gpt.py --arch llama);
#     qwen2, qwen3, mistral: the same shape in that family (architecture QWEN2, QWEN3 or
#     MISTRAL; rope_theta 1000000 as all three families ship; vocab 151,936 for the Qwens,
#     32,768 for Mistral; head_dim 64 written out for qwen3, whose heads are sized on their
#     own; Mistral's sliding_window half the context), the shape of
#     bench/peers/peer_fsdp_families.py --arch A. bf16, ZeRO-3, on each GPU count; prints per
#     count
#     BENCH gpu_train arch=A precision=P gpus=G tokens_per_s_per_gpu=T mfu=M peak_mem_gib=P
#       exposed_comm_pct=C ...
#       step_ms=... forward_ms=... backward_ms=... optimizer_ms=... (medians of the worker's
#       GPU-timed phases) ... activation_checkpointing=L offload=on|off
#     WEFT_BENCH_PRECISION (BF16 or FP8; default BF16) is the job's precision, the line's
#     precision= (bf16|fp8); WEFT_BENCH_AC (AUTO, NONE, SELECTIVE or FULL; default AUTO) is the job's
#     training.activation_checkpointing; the line reports the plan the engine ran at (the
#     job's MEMORY_PLANNED event), e.g. full+selective:0-15 (blocks 0-15 one level lighter). WEFT_BENCH_MB overrides the micro-batch; WEFT_BENCH_OFFLOAD=1
#     sets optimizer.offload, =auto optimizer.offload_auto (WEFT_BENCH_OFFLOAD_FRACTION
#     offload's offload_fraction; the line's
#     offload= is on, off or the share the engine offloaded); WEFT_BENCH_ACCUM sets training.grad_accum_steps (default 1);
#     WEFT_BENCH_MEMORY_LIMIT_GIB sets training.device_memory_limit_gib (a peer's memory, to
#     let AUTO choose within it: the limit counts the 1.5 GiB NCCL/runtime reserve, which the
#     peer's max_memory_allocated does not);
#     WEFT_BENCH_SHAPE="LAYERS WIDTH HEADS KV_HEADS FFN VOCAB SEQ" replaces the llama shape,
#     WEFT_BENCH_SHAPE="LAYERS WIDTH HEADS VOCAB SEQ" the gpt2 one (GPT 6.7B: "32 4096 32 50304
#     1024"), WEFT_BENCH_SHAPE="LAYERS WIDTH HEADS KV_HEADS FFN VOCAB SEQ HEAD_DIM WINDOW" the
#     qwen2/qwen3/mistral one (HEAD_DIM 0 or left out: WIDTH / HEADS, written as head_dim
#     only for qwen3 or where it differs; WINDOW 0 or left out: no sliding_window, and
#     written only for mistral; Qwen3 8B: "36 4096 32 8 12288 151936 4096 128 0", Mistral 7B
#     at 16k: "32 4096 32 8 14336 32768 16384 128 4096");
#     WEFT_BENCH_TRANSPORT=net makes every worker a host of its own with NCCL on its network
#     transport (start_workers); WEFT_BENCH_SHARD=hybrid sets sharding { scope: HOST } (with
#     one GPU per declared host: replicas only, each gradient shard all-reduced across them),
#     =auto sets scope AUTO; WEFT_BENCH_REPLICA_FORMAT (fp32, bf16, int8) its
#     replica_reduce_format. The line ends transport=nvlink|net
#     shard=full|hybrid+F[+sharded]|auto+F[+sharded] auto_choice=SCOPE[+sharded][+format] (what
#     AUTO chose; na otherwise) intra_host_gb_per_step= inter_host_gb_per_step= (rank 0's
#     collective bytes of a step, StepMetrics).
#     WEFT_BENCH_STEPS the steps (default 60; tokens/s counts from step 10, or from the
#     first reported step past a fifth of them).
#     tokens/s is end to end: steps completed between two coordinator timestamps (step 10 and
#     the last), so reporting, data loading and host overheads count. peak_mem_gib is what the
#     engine allocated (PyTorch's max_memory_allocated analogue); device_used_gib is the whole
#     device (CUDA context and NCCL included). exposed_comm_pct is the time the compute stream
#     waited for collectives (GPU timing events) over the step time. mfu counts the peer's
#     FLOPs per token (worker/mfu.h: 6 x parameters + 12 x layers x width x context).
#     WEFT_BENCH_MANIFEST=DIR trains on a dataset written by `trainctl data prepare` (DIR or
#     DIR/manifest.json; a path on this machine) instead of DATA_FILE's bytes, in every mode:
#     the job's data is `data { manifest_path: "DIR" }` (the manifest brings the shards, the
#     validation split and the tokenizer; DATA_FILE is then not read: any word, e.g. -), and
#     the model's vocabulary is the tokenizer's (the manifest's tokenizer.vocab_size) where the
#     shape does not say; a WEFT_BENCH_SHAPE vocabulary smaller than it is refused. The text
#     for the FP8-vs-BF16 loss check: bench/text_corpus.sh, then
#       trainctl data prepare --out DIR --tokenizer tokenizer.model --val-fraction 0.01 CORPUS
#     (with a 32,000-piece tokenizer, e.g. WEFT_BENCH_SHAPE="16 2048 32 8 8192 32000 2048").
#   bench/gpu_train_bench.sh transport BIN_DIR DATA_FILE [gpt2|llama|qwen2|qwen3|mistral]
#     On 2 GPUs, in one call: NCCL's own choice (NVLink) with full sharding, then the network
#     transport with full sharding and with hybrid sharding; one gpu_train line each.
#   bench/gpu_train_bench.sh cluster BIN_DIR DATA_FILE HxG [gpt2|llama|qwen2|qwen3|mistral]
#     H simulated hosts of G GPUs each on this machine (bench/sim_cluster.sh: a network
#     namespace per host, veth links, NCCL's network transport between hosts and NVLink within),
#     after the same H x G GPUs as one host, in one call; WEFT_BENCH_LINK_GBPS (default "0":
#     unshaped; e.g. "0 25") the link rates to run at, each a run of its own. Every line of this
#     mode ends hosts=H gpus_per_host=G link_gbps=R inter_host_busbw_gbps=AG/AR (NCCL all-gather
#     and all-reduce bus bandwidth across the hosts, measured in that run before the job)
#     vs_single_host=X (tokens/s per GPU over the one-host run's). Needs root, ip and tc.
#     WEFT_BENCH_LINK_DELAY_MS adds that one-way delay at each end (netem; refused, naming the
#     missing qdisc, on a kernel without it, as the GPU machine's). The one-host run shards
#     fully; the hosts' runs take WEFT_BENCH_SHARD, WEFT_BENCH_REPLICA_FORMAT and
#     WEFT_BENCH_REPLICA_OPTIMIZER, or with WEFT_BENCH_VARIANTS (e.g. "hybrid+fp32 hybrid+bf16
#     auto+int8 hybrid+bf16+sharded") one run of each at every rate.
#     WEFT_BENCH_ONE_HOST=skip leaves the one-host run out (vs_single_host then reads 1.0) and
#     WEFT_BENCH_VARIANTS=skip Weft's runs across hosts: a call of peers only.
#     WEFT_BENCH_PEERS (e.g. "fsdp2_hsdp deepspeed_zeropp"; names in bench/peers/sim_peers.sh)
#     runs those peers after Weft at each rate, on the same cluster with the same shape,
#     micro-batch and accumulation: BENCH peer_cluster peer=NAME hosts=H ... tok_s_per_gpu=..
#     mfu=.. maxmem_gib=.. accum=.. (status=failed when one fails; the bench goes on).
#   bench/gpu_train_bench.sh wire_curve BIN_DIR DATA_FILE [cuda|cpu]
#     The replica all-reduce's formats on real text: a small byte-level GPT (6 x 256, context
#     256, micro-batch 8, WEFT_BENCH_STEPS default 300) under sharding HOST on
#     WEFT_BENCH_WIRE_WORKERS (default 2) workers, each a host of its own (replicas of one
#     rank: the all-reduce carries every gradient), in fp32, bf16 and int8; prints how far each
#     compressed curve is from the exact one and its bytes across hosts against fp32's:
#     BENCH wire_curve ... bf16_max_rel= bf16_mean_rel= bf16_last20_rel= (mean loss of the last
#     20 steps) bf16_inter_bytes_vs_fp32= int8_... loss_first= loss_fp32=
#   bench/gpu_train_bench.sh curve BIN_DIR DATA_FILE
#     A small byte-level GPT on real text (DATA_FILE, bytes), 300 steps, global batch 16, on
#     1 GPU, 2 GPUs and 1 CPU worker; prints the largest per-step relative loss difference of
#     2 GPUs vs 1 GPU and of 1 GPU vs the CPU engine:
#     BENCH gpu_curve steps=300 gpu2_vs_gpu1_max_rel=... gpu1_vs_cpu_max_rel=... ...
set -euo pipefail
mode=${1:?throughput|curve}
BIN=$(cd "${2:?bin dir}" && pwd)
DATA=$(readlink -f "${3:?data file}")
COUNTS=${4:-"1 2"}
ARCH=${5:-gpt2}
# WEFT_BENCH_MANIFEST: a prepared dataset (the header says); MANIFEST_VOCAB its tokenizer's
# vocabulary, which the model's must hold.
MANIFEST="" MANIFEST_VOCAB=""
if [[ -n ${WEFT_BENCH_MANIFEST:-} ]]; then
  MANIFEST=$(readlink -f "$WEFT_BENCH_MANIFEST")
  [[ ! -f $MANIFEST ]] || MANIFEST=$(dirname "$MANIFEST")  # DIR/manifest.json: DIR
  MANIFEST_VOCAB=$(python3 -c 'import json, sys
print(int(json.load(open(sys.argv[1] + "/manifest.json"))["tokenizer"]["vocab_size"]))' \
    "$MANIFEST" 2>/dev/null) || {
    echo "gpu_train_bench: WEFT_BENCH_MANIFEST=$WEFT_BENCH_MANIFEST: no readable manifest.json" \
      "of a dataset written by trainctl data prepare" >&2
    exit 2
  }
fi
# check_vocab V: a model vocabulary of V must hold every id of the manifest's tokenizer.
check_vocab() {
  [[ -z $MANIFEST_VOCAB ]] || (($1 >= MANIFEST_VOCAB)) || {
    echo "gpu_train_bench: vocabulary $1 (WEFT_BENCH_SHAPE) is smaller than the tokenizer's" \
      "$MANIFEST_VOCAB in $MANIFEST/manifest.json" >&2
    exit 2
  }
}
# WEFT_BENCH_WORK keeps the logs and status streams (default: a fresh temporary folder).
WORK=${WEFT_BENCH_WORK:-$(mktemp -d /tmp/weft-gpu-bench.XXXXXX)}
mkdir -p "$WORK"
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/procs.sh"
source "$(dirname "${BASH_SOURCE[0]}")/sim_cluster.sh"
# The trained models are not kept: a 13B one is 26 GB, and a few runs fill a device's disk.
weft_stop_at_exit TERM "$WORK/models"

# A fresh coordinator per job: workers stopped for the previous job would otherwise still be
# registered (idle until their heartbeat deadline) and could be handed the next job.
start_coordinator() {
  # The simulated hosts dial it from their namespaces, over TLS (bench/sim_cluster.sh).
  local host=127.0.0.1 tls=()
  if ((${WEFT_BENCH_HOSTS:-1} > 1)); then
    host=0.0.0.0
    tls=(--tls-cert="$SIM_PKI/server.pem" --tls-key="$SIM_PKI/server.key")
  fi
  WEFT_SERVE_HOST=$host weft_serve "$WORK/coordinator-$1" "$BIN/weft-coordinator" \
    --data-dir="$WORK/coordinator-$1" --metrics-address=none "${tls[@]}"
  COORDINATOR_PID=$WEFT_SPAWNED_PID
}
stop_coordinator() { weft_stop "$COORDINATOR_PID"; }

# start_workers KIND COUNT: starts COUNT workers (cuda:0.. or cpu:0..), sets WORKER_PIDS.
# WEFT_BENCH_TRANSPORT=net declares each worker a host of its own (--host-id, and NCCL_HOSTID
# so that NCCL agrees) and turns NCCL's peer-to-peer and shared-memory transports off, so every
# collective goes through NCCL's network transport as it would between hosts; nvlink (the
# default) leaves NCCL its own choice.
# WEFT_BENCH_HOSTS=H (> 1, with a cluster up: sim_cluster_up) puts worker i on simulated host
# i / (COUNT / H), in its namespace, dialing the coordinator at its gateway.
start_workers() {
  WORKER_PIDS=()
  local hosts=${WEFT_BENCH_HOSTS:-1}
  for ((i = 0; i < $2; i++)); do
    local net=() wrap=()
    if ((hosts > 1)); then
      local k=$((i / ($2 / hosts)))
      wrap=(ip netns exec "$(sim_netns "$k")")
      net=(--host-id="sim-host-$k" --nccl-env=NCCL_HOSTID="sim-host-$k"
           --net-interface="$(sim_ifname "$k")" --data-address="$(sim_address "$k")"
           --coordinator="$(sim_gateway "$k"):${WEFT_COORDINATOR##*:}"
           --nccl-socket-threads=4 --nccl-env=NCCL_NSOCKS_PERTHREAD=4 --tls-ca="$SIM_PKI/ca.pem")
    elif [[ ${WEFT_BENCH_TRANSPORT:-nvlink} == net ]]; then
      net=(--host-id="bench-host-$i" --nccl-env=NCCL_HOSTID="bench-host-$i"
           --nccl-env=NCCL_P2P_DISABLE=1 --nccl-env=NCCL_SHM_DISABLE=1)
    fi
    # CPU workers get 8 BLAS threads so the reference curve finishes inside a device call.
    weft_spawn "$WORK/worker-$1$i-$RANDOM.log" "${wrap[@]}" "$BIN/weft-worker" --device="$1:$i" \
      --checkpointd=none --metrics-address=none $([[ $1 == cpu ]] && echo --blas-threads=8) \
      --output-dir="$WORK/models" --worker-id="bench-$1$i-$RANDOM" "${net[@]}"
    WORKER_PIDS+=("$WEFT_SPAWNED_PID")
  done
}
stop_workers() { weft_stop "${WORKER_PIDS[@]}"; }

# The job's sharding block: WEFT_BENCH_SHARD full (none), hybrid (HOST) or auto (AUTO), with
# WEFT_BENCH_REPLICA_FORMAT (fp32, bf16 or int8) its replica_reduce_format and
# WEFT_BENCH_REPLICA_OPTIMIZER (replicated or sharded) its replica_optimizer.
sharding_block() {
  local scope format=${WEFT_BENCH_REPLICA_FORMAT:-fp32}
  local optimizer=${WEFT_BENCH_REPLICA_OPTIMIZER:-replicated}
  case ${WEFT_BENCH_SHARD:-full} in
  hybrid) scope=HOST ;;
  auto) scope=AUTO ;;
  *) return 0 ;;
  esac
  echo "sharding { scope: $scope replica_reduce_format: WIRE_${format^^}" \
    "replica_optimizer: OPTIMIZER_${optimizer^^} }"
}

# The job's data block: the prepared dataset of WEFT_BENCH_MANIFEST, else DATA_FILE's bytes.
data_block() {
  if [[ -n $MANIFEST ]]; then
    echo "data { manifest_path: \"$MANIFEST\" }"
  else
    echo "data { train_path: \"$DATA\" format: DATA_FORMAT_TEXT_BYTES val_fraction: 0.05 }"
  fi
}

# spec NAME KIND WORKERS LAYERS WIDTH HEADS VOCAB CONTEXT MICRO_BATCH STEPS LR [MODEL_FIELDS]
# MODEL_FIELDS (optional): extra ModelSpec fields, e.g. "architecture: LLAMA num_kv_heads: 8"
# (the Qwen and Mistral families add head_dim and sliding_window).
spec() {
  cat <<SPEC
name: "$1"
model { num_layers: $4 hidden_size: $5 num_heads: $6 vocab_size: $7 context_length: $8 ${12:-} }
$(data_block)
optimizer { learning_rate: ${11} weight_decay: 0.1 grad_clip_norm: 1.0
            offload: $([[ ${WEFT_BENCH_OFFLOAD:-0} == 1 ]] && echo true || echo false)
            offload_auto: $([[ ${WEFT_BENCH_OFFLOAD:-0} == auto ]] && echo true || echo false)
            $([[ -n ${WEFT_BENCH_OFFLOAD_FRACTION:-} ]] && echo "offload_fraction: $WEFT_BENCH_OFFLOAD_FRACTION") }
lr_schedule { kind: COSINE warmup_steps: $(( ${10} >= 60 ? 20 : ${10} / 4 )) min_lr_ratio: 0.1 }
training { total_steps: ${10} micro_batch_size: $9 sequence_length: $8 seed: 1337
           grad_accum_steps: ${WEFT_BENCH_ACCUM:-1}
           activation_checkpointing: ${WEFT_BENCH_AC:-AUTO}
           device_memory_limit_gib: ${WEFT_BENCH_MEMORY_LIMIT_GIB:-0} }
zero_stage: 3
$([[ -n ${WEFT_BENCH_PRECISION:-} ]] && echo "precision: $WEFT_BENCH_PRECISION")
$(sharding_block)
resources { device_kind: DEVICE_KIND_$2 min_workers: $3 max_workers: $3 }
fault { heartbeat_interval_ms: 500 heartbeat_timeout_ms: 5000 max_restarts: 0 }
SPEC
}

# run_job SPEC_FILE OUT_JSONL: submits, follows to the end, keeps every status update.
run_job() {
  local trainctl=$BIN/trainctl
  if ((${WEFT_BENCH_HOSTS:-1} > 1)); then  # the coordinator serves TLS
    printf '#!/bin/sh\nexec "%s" --tls-ca="%s" "$@"\n' "$BIN/trainctl" "$SIM_PKI/ca.pem" \
      >"$WORK/trainctl"
    chmod +x "$WORK/trainctl"
    trainctl=$WORK/trainctl
  fi
  weft_run_job "$trainctl" "$1" "$2" "$WORK"/worker-*.log >/dev/null
}

case "$mode" in
cluster)
  IFS=x read -r H G <<<"${4:?HxG, e.g. 2x1}"
  if [[ ${WEFT_BENCH_ONE_HOST:-run} != skip ]]; then
    WEFT_BENCH_HOSTS=1 WEFT_BENCH_SHARD=full WEFT_BENCH_WORK="$WORK/one-host" \
      "${BASH_SOURCE[0]}" throughput "$BIN" "$DATA" $((H * G)) "${5:-gpt2}" |
      tee "$WORK/one-host.txt"
    single=$(grep -o 'tokens_per_s_per_gpu=[0-9]*' "$WORK/one-host.txt" | head -n 1 | cut -d= -f2)
  fi
  trap 'sim_cluster_down; weft_stop_all' EXIT
  [[ -z ${WEFT_BENCH_PEERS:-} ]] || source "$(dirname "${BASH_SOURCE[0]}")/peers/sim_peers.sh"
  for rate in ${WEFT_BENCH_LINK_GBPS:-0}; do
    sim_cluster_up "$H" "$rate" "${WEFT_BENCH_LINK_DELAY_MS:-0}"
    read -r ag ar <<<"$(sim_busbw "$H" "$G")"
    for variant in ${WEFT_BENCH_VARIANTS:-as-set}; do
      [[ $variant != skip ]] || continue
      [[ $variant == as-set ]] || IFS=+ read -r WEFT_BENCH_SHARD WEFT_BENCH_REPLICA_FORMAT \
        WEFT_BENCH_REPLICA_OPTIMIZER <<<"$variant"
      SIM_PKI=$SIM_PKI SIM_PREFIX=$SIM_PREFIX WEFT_BENCH_HOSTS=$H WEFT_BENCH_TRANSPORT=net \
        WEFT_BENCH_SIM="$H $G $rate $ag/$ar ${single:-0}" \
        WEFT_BENCH_SHARD=${WEFT_BENCH_SHARD:-full} \
        WEFT_BENCH_REPLICA_FORMAT=${WEFT_BENCH_REPLICA_FORMAT:-fp32} \
        WEFT_BENCH_REPLICA_OPTIMIZER=${WEFT_BENCH_REPLICA_OPTIMIZER:-replicated} \
        WEFT_BENCH_WORK="$WORK/hosts-$rate-$variant" "${BASH_SOURCE[0]}" throughput "$BIN" \
        "$DATA" $((H * G)) "${5:-gpt2}"
    done
    # shellcheck disable=SC2086  # a list of peer names
    [[ -z ${WEFT_BENCH_PEERS:-} ]] || WEFT_BENCH_WORK=$WORK \
      sim_peers_bench "$H" "$G" "$rate" "$ag/$ar" "${5:-gpt2}" $WEFT_BENCH_PEERS
    sim_cluster_down
  done
  ;;
transport)
  for run in "nvlink full" "net full" "net hybrid"; do
    read -r WEFT_BENCH_TRANSPORT WEFT_BENCH_SHARD <<<"$run"
    export WEFT_BENCH_TRANSPORT WEFT_BENCH_SHARD
    WEFT_BENCH_WORK="$WORK/$WEFT_BENCH_TRANSPORT-$WEFT_BENCH_SHARD" \
      "${BASH_SOURCE[0]}" throughput "$BIN" "$DATA" 2 "${4:-gpt2}"
  done
  ;;
throughput)
  case "$ARCH" in
  gpt2) B=16 T=1024 ;;
  llama | qwen2 | qwen3 | mistral) B=8 T=2048 ;;
  *) echo "unknown architecture $ARCH (gpt2, llama, qwen2, qwen3 or mistral)" >&2; exit 2 ;;
  esac
  B=${WEFT_BENCH_MB:-$B}
  STEPS=${WEFT_BENCH_STEPS:-60}
  ACCUM=${WEFT_BENCH_ACCUM:-1}
  for g in $COUNTS; do
    if [[ $ARCH == llama ]]; then
      read -r L W H KV F V S <<<"${WEFT_BENCH_SHAPE:-16 2048 32 8 8192 ${MANIFEST_VOCAB:-128256} $T}"
      T=$S
      check_vocab "$V"
      spec "llama-${L}x$W-g$g" CUDA "$g" "$L" "$W" "$H" "$V" "$T" "$B" "$STEPS" 3e-4 \
        "architecture: LLAMA num_kv_heads: $KV intermediate_size: $F rope_theta: 500000" \
        >"$WORK/g$g.pb.txt"
    elif [[ $ARCH == qwen2 || $ARCH == qwen3 || $ARCH == mistral ]]; then
      V=151936 WIN=0
      [[ $ARCH != mistral ]] || V=32768 WIN=$((T / 2))
      V=${MANIFEST_VOCAB:-$V}
      read -r L W H KV F V S HD WIN <<<"${WEFT_BENCH_SHAPE:-16 2048 32 8 8192 $V $T 64 $WIN}"
      T=$S HD=${HD:-0} WIN=${WIN:-0}
      check_vocab "$V"
      ((HD > 0)) || HD=$((W / H))
      fields="architecture: ${ARCH^^} num_kv_heads: $KV intermediate_size: $F"
      fields+=" rope_theta: 1000000 tie_word_embeddings: false"
      # Qwen3 sizes its heads on its own (Qwen3 0.6B: 16 heads of 128 in a width of 1024), so
      # its spec always says; the others only when it is not the width's share.
      if [[ $ARCH == qwen3 ]] || ((HD != W / H)); then fields+=" head_dim: $HD"; fi
      if [[ $ARCH == mistral ]] && ((WIN > 0)); then fields+=" sliding_window: $WIN"; fi
      spec "$ARCH-${L}x$W-g$g" CUDA "$g" "$L" "$W" "$H" "$V" "$T" "$B" "$STEPS" 3e-4 \
        "$fields" >"$WORK/g$g.pb.txt"
    else
      read -r L W H V S <<<"${WEFT_BENCH_SHAPE:-12 768 12 ${MANIFEST_VOCAB:-50304} $T}"
      T=$S
      check_vocab "$V"
      spec "gpt2-${L}x$W-g$g" CUDA "$g" "$L" "$W" "$H" "$V" "$T" "$B" "$STEPS" 6e-4 \
        >"$WORK/g$g.pb.txt"
    fi
    start_coordinator "g$g"
    start_workers cuda "$g"
    run_job "$WORK/g$g.pb.txt" "$WORK/g$g.jsonl"
    stop_workers
    stop_coordinator
    rm -rf "$WORK/models"
    shard=${WEFT_BENCH_SHARD:-full}
    [[ $shard == full ]] || shard+="+${WEFT_BENCH_REPLICA_FORMAT:-fp32}"
    [[ $shard == full || ${WEFT_BENCH_REPLICA_OPTIMIZER:-replicated} == replicated ]] ||
      shard+="+${WEFT_BENCH_REPLICA_OPTIMIZER}"
    python3 - "$WORK/g$g.jsonl" "$g" "$ARCH" "$B" "$T" "$ACCUM" \
      "${WEFT_BENCH_TRANSPORT:-nvlink}" "$shard" \
      "${WEFT_BENCH_SIM:-1 $g na na/na 0}" <<'PY'
import json, os, sys
from datetime import datetime
path, gpus, arch = sys.argv[1], int(sys.argv[2]), sys.argv[3]
precision = os.environ.get("WEFT_BENCH_PRECISION", "BF16").lower()
transport, shard = sys.argv[7], sys.argv[8]
# Simulated hosts (the cluster mode): hosts, GPUs per host, link rate, measured bus bandwidth,
# and the one-host run's tokens/s per GPU (0: this is that run, or not the cluster mode).
sim_hosts, sim_per, sim_rate, sim_busbw, sim_single = sys.argv[9].split()
B, T, accum = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
offload = "off"
chosen = "na"
steps = {}
level = "?"
for line in open(path):
    s = json.loads(line)
    m = s.get("last_metrics")
    if m and "step" in m:
        steps[int(m["step"])] = m
    for e in s.get("events", []):
        if e.get("type") == "SHARDING_CHOSEN":
            # "HOST: ...; replica all-reduce WIRE_BF16: ...", "HOST with OPTIMIZER_SHARDED: ..."
            # or "WORLD: ..."
            head = e["message"].split(":", 1)[0]
            chosen = head.split()[0] + ("+sharded" if "OPTIMIZER_SHARDED" in head else "")
            said = e["message"].split("replica all-reduce WIRE_", 1)
            if len(said) == 2:
                chosen += "+" + said[1].split(":")[0].lower()
        if e.get("type") == "MEMORY_PLANNED":
            # "activation checkpointing full, selective for blocks 0-16 (chosen by AUTO): ..."
            said = e["message"].split("activation checkpointing ", 1)[1].split(" (", 1)[0]
            level = said.replace(", ", "+").replace(" for blocks ", ":").replace(" for block ", ":")
            # "...; optimizer offloaded to the host for units 20-32 of 0-32 (offload_fraction 0.38)"
            if "(offload_fraction " in e["message"]:
                share = e["message"].split("(offload_fraction ", 1)[1].split(")", 1)[0]
                offload = "on" if share == "1.00" else share
def ts(m):
    return datetime.fromisoformat(m["time"].replace("Z", "+00:00")).timestamp()
last = max(steps) if steps else 0
start = min(10, max(1, last // 5))
if not any(k >= start for k in steps) or last <= start:
    sys.exit(f"too few step metrics in {path}: last status {line.strip()[:2000]}")
first = min(k for k in steps if k >= start)
last = max(steps)
tokens = (last - first) * B * T * accum * gpus
tps = tokens / (ts(steps[last]) - ts(steps[first]))
per_gpu = tps / gpus
late = [steps[k] for k in steps if k >= first]
def med(xs):
    xs = sorted(xs); return xs[len(xs) // 2]
# The MFU the worker reports (worker/mfu.h) is its FLOPs per token over the device peak, times
# its own tokens/s per GPU; the same ratio times the end-to-end tokens/s is the end-to-end MFU.
flops_per_token_over_peak = med([float(m.get("mfu", 0)) * gpus / float(m["tokens_per_s"])
                                 for m in late])
step_ms = med([float(m["step_ms"]) for m in late])
phase = {k: med([float(m.get(k, 0)) for m in late])
         for k in ("forward_ms", "backward_ms", "optimizer_ms")}
exposed = med([float(m.get("exposed_comm_ms", 0)) for m in late])
peak = max(int(m.get("engine_device_bytes", 0)) for m in late) / 2**30
# Bytes rank 0's collectives sent a step, within its host and across hosts (StepMetrics).
intra = med([int(m.get("intra_host_bytes", 0)) for m in late]) / 1e9
inter = med([int(m.get("inter_host_bytes", 0)) for m in late]) / 1e9
used = max(int(m.get("device_used_bytes", 0)) for m in late) / 2**30
print(f"BENCH gpu_train arch={arch} precision={precision} gpus={gpus} "
      f"tokens_per_s_per_gpu={per_gpu:.0f} "
      f"mfu={per_gpu * flops_per_token_over_peak:.3f} peak_mem_gib={peak:.2f} "
      f"exposed_comm_pct={100 * exposed / step_ms:.1f} device_used_gib={used:.2f} "
      f"step_ms={step_ms:.1f} forward_ms={phase['forward_ms']:.1f} "
      f"backward_ms={phase['backward_ms']:.1f} optimizer_ms={phase['optimizer_ms']:.1f} "
      f"reported_tokens_per_s_per_gpu={B*T*accum*1000/step_ms:.0f} "
      f"steps={first}-{last} loss={float(steps[last]['loss']):.3f} "
      f"activation_checkpointing={level} offload={offload} transport={transport} "
      f"shard={shard} auto_choice={chosen} intra_host_gb_per_step={intra:.2f} "
      f"inter_host_gb_per_step={inter:.2f} "
      f"hosts={sim_hosts} gpus_per_host={sim_per} link_gbps={sim_rate} "
      f"inter_host_busbw_gbps={sim_busbw} "
      f"vs_single_host={per_gpu / float(sim_single) if float(sim_single) > 0 else 1.0:.3f}",
      flush=True)
PY
  done
  ;;
curve)
  steps=300
  V=${MANIFEST_VOCAB:-256}
  spec curve-g1 CUDA 1 4 128 4 "$V" 128 16 $steps 3e-3 >"$WORK/c1.pb.txt"
  spec curve-g2 CUDA 2 4 128 4 "$V" 128 8 $steps 3e-3 >"$WORK/c2.pb.txt"
  spec curve-cpu CPU 1 4 128 4 "$V" 128 16 $steps 3e-3 >"$WORK/cc.pb.txt"
  for run in "c1 cuda 1" "c2 cuda 2" "cc cpu 1"; do
    set -- $run
    start_coordinator "$1"
    start_workers "$2" "$3"
    run_job "$WORK/$1.pb.txt" "$WORK/$1.jsonl"
    stop_workers
    stop_coordinator
  done
  python3 - "$WORK/c1.jsonl" "$WORK/c2.jsonl" "$WORK/cc.jsonl" $steps <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        m = json.loads(line).get("last_metrics")
        if m and "step" in m:
            out[int(m["step"])] = float(m["loss"])
    return out
g1, g2, cpu = (losses(p) for p in sys.argv[1:4])
def worst(a, b):
    common = sorted(set(a) & set(b))
    return max(abs(a[k] - b[k]) / b[k] for k in common), len(common)
w21, n21 = worst(g2, g1)
w1c, n1c = worst(g1, cpu)
last = int(sys.argv[4])
print(f"BENCH gpu_curve steps={last} gpu2_vs_gpu1_max_rel={w21:.4f} compared={n21} "
      f"gpu1_vs_cpu_max_rel={w1c:.4f} compared_cpu={n1c} loss_first={g1[min(g1)]:.3f} "
      f"loss_gpu1={g1.get(last, float('nan')):.3f} loss_gpu2={g2.get(last, float('nan')):.3f} "
      f"loss_cpu={cpu.get(last, float('nan')):.3f}", flush=True)
PY
  ;;
wire_curve)
  # KIND=cuda|cpu, N workers each a host of its own: HOST scope is N replicas of one rank.
  kind=${4:-cuda}
  n=${WEFT_BENCH_WIRE_WORKERS:-2}
  steps=${WEFT_BENCH_STEPS:-300}
  for format in fp32 bf16 int8; do
    WEFT_BENCH_SHARD=hybrid WEFT_BENCH_REPLICA_FORMAT=$format \
      spec "wire-$format" "${kind^^}" "$n" 6 256 8 "${MANIFEST_VOCAB:-256}" 256 8 "$steps" 2e-3 \
      >"$WORK/w-$format.pb.txt"
    start_coordinator "w-$format"
    WEFT_BENCH_TRANSPORT=net start_workers "$kind" "$n"
    run_job "$WORK/w-$format.pb.txt" "$WORK/w-$format.jsonl"
    stop_workers
    stop_coordinator
  done
  python3 - "$WORK" "$steps" "$kind" "$n" <<'PY'
import json, sys
work, steps, kind, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def curve(fmt):
    losses, inter = {}, {}
    for line in open(f"{work}/w-{fmt}.jsonl"):
        m = json.loads(line).get("last_metrics")
        if m and "step" in m:
            losses[int(m["step"])] = float(m["loss"])
            inter[int(m["step"])] = int(m.get("inter_host_bytes", 0))
    return losses, inter
exact, exact_bytes = curve("fp32")
out = [f"BENCH wire_curve kind={kind} replicas={n} steps={steps} compared={len(exact)}"]
for fmt in ("bf16", "int8"):
    got, got_bytes = curve(fmt)
    common = sorted(set(got) & set(exact))
    rel = [abs(got[k] - exact[k]) / exact[k] for k in common]
    tail = [k for k in common if k > steps - 20]
    exact_tail = sum(exact[k] for k in tail)
    final = abs(sum(got[k] for k in tail) - exact_tail) / exact_tail
    ratio = (sum(got_bytes.values()) / max(1, sum(exact_bytes.values())))
    out.append(f"{fmt}_max_rel={max(rel):.4f} {fmt}_mean_rel={sum(rel) / len(rel):.4f} "
               f"{fmt}_last20_rel={final:.4f} {fmt}_inter_bytes_vs_fp32={ratio:.3f}")
last = max(exact)
out.append(f"loss_first={exact[min(exact)]:.3f} loss_fp32={exact[last]:.3f}")
print(" ".join(out), flush=True)
PY
  ;;
*)
  echo "usage: $0 throughput|transport|cluster|curve|wire_curve BIN_DIR DATA_FILE" \
    "[GPU_COUNTS|HxG|KIND] [gpt2|llama|qwen2|qwen3|mistral]" >&2
  exit 2
  ;;
esac
