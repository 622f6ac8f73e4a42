# shellcheck shell=bash
# The peer benchmarks (bench/peers/*.py) on the simulated hosts of bench/sim_cluster.sh, for
# issue 39's comparison: Weft and its peers on the same cluster, in the same call. Sourced after
# bench/sim_cluster.sh (bench/gpu_train_bench.sh's cluster mode does so when WEFT_BENCH_PEERS is
# set); needs PyTorch, and for the DeepSpeed peers deepspeed importable
# (bench/peers/install_deepspeed.sh prints the PYTHONPATH).
#
#   sim_peer HOSTS GPUS_PER_HOST SCRIPT ARGS...
#     Runs SCRIPT under torchrun, one torchrun per simulated host inside that host's network
#     namespace (with a cluster up: sim_cluster_up), that host's GPUs only (CUDA_VISIBLE_DEVICES),
#     NCCL told which host it is on (NCCL_HOSTID) and given the workers' socket settings, host
#     0 the rendezvous; prints rank 0's RESULT line. HOSTS=1 needs no cluster: plain torchrun
#     on this machine, the single-host baseline of a peer. On a failure or after
#     SIM_PEER_TIMEOUT seconds (default 300) it prints every host's last errors to stderr
#     and returns 1. The logs stay in SIM_PEER_LOGS (default: a fresh temporary folder).
#   sim_peers_bench HOSTS GPUS_PER_HOST LINK_GBPS BUSBW ARCH PEER...
#     Each PEER (a name of sim_peer_args) with the shape, micro-batch and accumulation of the
#     bench's Weft run (WEFT_BENCH_SHAPE, WEFT_BENCH_MB, WEFT_BENCH_ACCUM, read as the
#     throughput mode reads them), one line each:
#       BENCH peer_cluster peer=NAME hosts=H gpus_per_host=G link_gbps=R
#         inter_host_busbw_gbps=AG/AR tok_s_per_gpu=.. mfu=.. maxmem_gib=.. accum=..
#         step_ms=.. loss=.. [optimizer=.. zeropp=..]
#     or, when the peer fails, the same up to inter_host_busbw_gbps then status=failed; it
#     always returns 0, so the bench goes on. WEFT_BENCH_PEER_STEPS (default: enough for about
#     64 micro-steps) and WEFT_BENCH_PEER_ARGS (extra flags for every peer, e.g. --ac) tune it.

SIM_PEERS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# sim_peer_args NAME: the script and flags of a peer, one table for every caller.
sim_peer_args() {
  case $1 in
    fsdp2_hsdp) echo "fsdp2_hsdp.py --mesh hsdp --compile" ;;
    fsdp2_full) echo "fsdp2_hsdp.py --mesh full --compile" ;;
    deepspeed_zeropp) echo "deepspeed_zeropp.py --hpz --qw --qg" ;;
    deepspeed_zero3) echo "deepspeed_zeropp.py" ;;
    *) return 1 ;;
  esac
}

sim_peer() {
  local hosts=$1 per=$2 script=$3 k port master log rc=0 pids=()
  shift 3
  local logs=${SIM_PEER_LOGS:-$(mktemp -d /tmp/weft-sim-peer.XXXXXX)}
  mkdir -p "$logs"
  # A port of its own per run: the previous run's rendezvous socket may linger in TIME_WAIT.
  port=${SIM_PEER_PORT:-$((29600 + RANDOM % 300))}
  master=127.0.0.1
  ((hosts > 1)) && master=$(sim_address 0)
  for ((k = 0; k < hosts; k++)); do
    local wrap=() env=()
    if ((hosts > 1)); then
      wrap=(ip netns exec "$(sim_netns "$k")")
      env=(CUDA_VISIBLE_DEVICES="$(seq -s, $((k * per)) $((k * per + per - 1)))"
           NCCL_HOSTID="sim-host-$k" NCCL_SOCKET_IFNAME="$SIM_PREFIX"
           NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 GLOO_SOCKET_IFNAME="$(sim_ifname "$k")")
    fi
    log="$logs/host$k.log"
    "${wrap[@]}" env "${env[@]}" timeout -k 20 "${SIM_PEER_TIMEOUT:-300}" \
      python3 -m torch.distributed.run --nnodes "$hosts" --node_rank "$k" \
      --nproc_per_node "$per" --master_addr "$master" --master_port "$port" \
      "$SIM_PEERS_DIR/$script" "$@" >"$log" 2>&1 &
    pids+=($!)
  done
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}" || rc=$?
  done
  if grep -q '^RESULT ' "$logs/host0.log" && ((rc == 0)); then
    grep '^RESULT ' "$logs/host0.log" | tail -n 1
    return 0
  fi
  echo "sim_peer: $script on $hosts x $per failed (exit $rc$( ((rc == 124)) && echo ": timed out")); logs in $logs" >&2
  for ((k = 0; k < hosts; k++)); do
    echo "--- host $k: $logs/host$k.log" >&2
    # The ranks' own errors ([rankN]: lines), not torchrun's summary that follows them.
    { grep -E '^\[rank[0-9]+\]:|Error|error:' "$logs/host$k.log" || tail -n 15 "$logs/host$k.log"; } |
      tail -n 15 >&2
  done
  return 1
}

sim_peers_bench() {
  local hosts=$1 per=$2 rate=$3 busbw=$4 arch=$5 name spec result shape B A steps f
  shift 5
  # The Weft run's shape, micro-batch and accumulation (gpu_train_bench.sh's throughput mode).
  if [[ $arch == llama ]]; then B=8; else B=16; fi
  B=${WEFT_BENCH_MB:-$B}
  A=${WEFT_BENCH_ACCUM:-1}
  shape=()
  [[ -z ${WEFT_BENCH_SHAPE:-} ]] || shape=(--shape "$WEFT_BENCH_SHAPE")
  [[ $arch == llama ]] || [[ -n ${WEFT_BENCH_SHAPE:-} ]] || shape=(--shape "12 768 12 50304 1024")
  # About 64 micro-steps timed, 8 or one step of warm-up (compilation, op loading).
  steps=${WEFT_BENCH_PEER_STEPS:-$(((64 + A - 1) / A))}
  for name in "$@"; do
    local head="BENCH peer_cluster peer=$name hosts=$hosts gpus_per_host=$per link_gbps=$rate inter_host_busbw_gbps=$busbw"
    if ! spec=$(sim_peer_args "$name"); then
      echo "sim_peers: unknown peer $name (fsdp2_hsdp, fsdp2_full, deepspeed_zeropp, deepspeed_zero3)" >&2
      echo "$head status=failed"
      continue
    fi
    # shellcheck disable=SC2086  # the table's flags and WEFT_BENCH_PEER_ARGS split on spaces
    if result=$(SIM_PEER_LOGS=${WEFT_BENCH_WORK:+$WEFT_BENCH_WORK/peer-$name-$rate} sim_peer \
        "$hosts" "$per" $spec --arch "$arch" "${shape[@]}" --mb "$B" --accum "$A" \
        --steps "$steps" --warmup $(((8 + A - 1) / A)) ${WEFT_BENCH_PEER_ARGS:-}); then
      local out="$head"
      for f in tok_s_per_gpu mfu maxmem_GiB accum step_ms loss optimizer zeropp mesh; do
        [[ " $result " =~ \ $f=([^ ]*) ]] &&
          out+=" $(tr '[:upper:]' '[:lower:]' <<<"$f")=${BASH_REMATCH[1]}"
      done
      echo "$out"
    else
      echo "$head status=failed"
    fi
  done
  return 0
}
