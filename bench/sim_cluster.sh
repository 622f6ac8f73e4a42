# A cluster of simulated hosts on one machine, for the benches (sourced by
# bench/gpu_train_bench.sh; needs root and iproute2's `ip` and `tc`, which the GPU machine gets
# from the payload: scripts/device_payload.sh bundles them).
#
# Host k is a network namespace joined to the machine by a veth pair: the machine's end has
# 198.19.k.1/30 and the namespace's 198.19.k.2/30, whose default route is the machine, which
# forwards between namespaces as a switch would. A host's workers run in its namespace with one
# host id and NCCL_HOSTID, so NCCL joins a host's GPUs over NVLink and the hosts through its
# network transport (sockets), over these links. LINK_GBPS > 0 shapes both ends of every pair
# with a token bucket (tc tbf) to that rate: a host's upload and download.
#
# Measured on the GPU machine (2 x H200, 2026-11-28, 2 hosts x 1 GPU, NCCL 2.28 sockets with 4
# threads x 4 sockets, 256 MiB all-gathers): unshaped, about 70 Gb/s of bus bandwidth; through
# any qdisc about 48 at most, so rates up to about 45 Gb/s are what they say and higher ones
# are not reached. The kernel there has tbf and htb but no netem: latency cannot be added.
# Each BENCH line therefore carries the bus bandwidth measured in its own run (sim_busbw).
#
# The daemons serve plaintext on loopback only, so the hosts dial them over TLS: sim_cluster_up
# makes a throwaway CA and a server certificate for 127.0.0.1 and every gateway (openssl) in
# SIM_PKI; the coordinator serves it, the workers and trainctl trust SIM_PKI/ca.pem.

SIM_PREFIX=${SIM_PREFIX:-ws$$}  # inherited by the bench runs inside a cluster
SIM_HOSTS=0
SIM_SAVED_IP_FORWARD=""
SIM_PKI=${SIM_PKI:-}

sim_ifname() { echo "${SIM_PREFIX}k$1n"; }   # the namespace's end of host k's pair
sim_netns() { echo "${SIM_PREFIX}-host$1"; }
sim_gateway() { echo "198.19.$1.1"; }           # the machine's end: where host k dials daemons
sim_address() { echo "198.19.$1.2"; }

# sim_shape DEV [NETNS]: DEV's egress limited to SIM_LINK_GBPS (tbf) and delayed by
# SIM_LINK_DELAY_MS (netem, one way); says which qdisc the kernel lacks when it does.
sim_shape() {
  local dev=$1 in=() where=(root)
  [[ -n ${2:-} ]] && in=(ip netns exec "$2")
  if [[ ${SIM_LINK_DELAY_MS:-0} != 0 ]]; then
    "${in[@]}" tc qdisc add dev "$dev" root handle 1: netem delay "${SIM_LINK_DELAY_MS}ms" || {
      echo "sim_cluster: the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM):" \
        "latency cannot be emulated here" >&2
      return 1
    }
    where=(parent 1:1)
  fi
  if [[ ${SIM_LINK_GBPS:-0} != 0 ]]; then
    "${in[@]}" tc qdisc add dev "$dev" "${where[@]}" tbf rate "${SIM_LINK_GBPS}gbit" \
      burst 64mb latency 100ms || {
      echo "sim_cluster: could not shape $dev with tbf (CONFIG_NET_SCH_TBF?)" >&2
      return 1
    }
  fi
}

# sim_cluster_up HOSTS LINK_GBPS [DELAY_MS]: makes the namespaces and links (removed by
# sim_cluster_down, which the caller must run at exit). LINK_GBPS 0: unshaped; DELAY_MS (one
# way, each end: netem) needs a kernel with netem, which the GPU machine's lacks.
sim_cluster_up() {
  local hosts=$1 k ns
  SIM_LINK_GBPS=$2
  SIM_LINK_DELAY_MS=${3:-0}
  command -v ip >/dev/null && command -v tc >/dev/null || {
    echo "sim_cluster: needs iproute2's ip and tc on PATH" >&2
    return 1
  }
  sim_pki "$hosts" || return 1
  SIM_SAVED_IP_FORWARD=$(cat /proc/sys/net/ipv4/ip_forward)
  echo 1 >/proc/sys/net/ipv4/ip_forward
  for ((k = 0; k < hosts; k++)); do
    ns=$(sim_netns "$k")
    ip netns add "$ns"
    SIM_HOSTS=$((k + 1))
    ip link add "${SIM_PREFIX}k${k}h" type veth peer name "$(sim_ifname "$k")"
    ip link set "$(sim_ifname "$k")" netns "$ns"
    ip addr add "$(sim_gateway "$k")/30" dev "${SIM_PREFIX}k${k}h"
    ip link set "${SIM_PREFIX}k${k}h" up mtu 9000
    ip -n "$ns" addr add "$(sim_address "$k")/30" dev "$(sim_ifname "$k")"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$(sim_ifname "$k")" up mtu 9000
    ip -n "$ns" route add default via "$(sim_gateway "$k")"
    sim_shape "${SIM_PREFIX}k${k}h" || return 1
    sim_shape "$(sim_ifname "$k")" "$ns" || return 1
  done
}

# sim_pki HOSTS: SIM_PKI/{ca.pem, server.pem, server.key}, the server's names 127.0.0.1 and
# the HOSTS gateways.
sim_pki() {
  local k sans="IP:127.0.0.1"
  for ((k = 0; k < $1; k++)); do sans+=",IP:$(sim_gateway "$k")"; done
  SIM_PKI=$(mktemp -d /tmp/weft-sim-pki.XXXXXX)
  (
    cd "$SIM_PKI" &&
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=weft bench CA" -days 2 -keyout ca.key -out ca.pem &&
      printf 'basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\nextendedKeyUsage = serverAuth, clientAuth\nsubjectAltName = %s\n' \
        "$sans" >server.ext &&
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=weft bench coordinator" -keyout server.key -out server.csr &&
      openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
        -extfile server.ext -out server.pem
  ) >"$SIM_PKI/openssl.log" 2>&1 || {
    echo "sim_cluster: could not make the bench's certificates:" >&2
    cat "$SIM_PKI/openssl.log" >&2
    return 1
  }
}

sim_cluster_down() {
  local k
  for ((k = 0; k < SIM_HOSTS; k++)); do
    ip link del "${SIM_PREFIX}k${k}h" 2>/dev/null || true
    ip netns del "$(sim_netns "$k")" 2>/dev/null || true
  done
  SIM_HOSTS=0
  [[ -z $SIM_PKI ]] || rm -rf "$SIM_PKI"
  SIM_PKI=""
  [[ -z $SIM_SAVED_IP_FORWARD ]] || echo "$SIM_SAVED_IP_FORWARD" >/proc/sys/net/ipv4/ip_forward
}

# sim_busbw HOSTS GPUS_PER_HOST: the NCCL bus bandwidth across the hosts, in Gb/s, as
# "ALLGATHER ALLREDUCE" (256 MiB per rank; one rank per GPU, in its host's namespace, with the
# workers' socket settings), through PyTorch's NCCL; "na na" where PyTorch is missing.
sim_busbw() {
  local per=$2 world=$(($1 * $2)) r k out pids=()
  python3 -c "import torch.distributed" 2>/dev/null || { echo "na na"; return 0; }
  out=$(mktemp -d)
  cat >"$out/busbw.py" <<'PY'
import os, sys, time, torch, torch.distributed as dist
rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD"]), int(os.environ["LOCAL"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", init_method=os.environ["INIT"], rank=rank, world_size=world)
n = (256 << 20) // 4
x = torch.ones(n, device="cuda"); out = torch.empty(world * n, device="cuda")
res = []
for op, factor in ((lambda: dist.all_gather_into_tensor(out, x), (world - 1) / world * world),
                   (lambda: dist.all_reduce(x), 2 * (world - 1) / world)):
    for _ in range(3): op()
    torch.cuda.synchronize(); t = time.time()
    for _ in range(10): op()
    torch.cuda.synchronize(); dt = (time.time() - t) / 10
    res.append(n * 4 * factor / dt * 8 / 1e9)
if rank == 0: print(f"{res[0]:.1f} {res[1]:.1f}")
dist.destroy_process_group()
PY
  for ((r = 0; r < world; r++)); do
    k=$((r / per))
    ip netns exec "$(sim_netns "$k")" env RANK=$r WORLD=$world LOCAL=$r \
      INIT="tcp://$(sim_address 0):29533" NCCL_HOSTID="sim-host-$k" \
      NCCL_SOCKET_IFNAME="$SIM_PREFIX" NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 \
      timeout 120 python3 "$out/busbw.py" >"$out/rank$r.txt" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}" || true
  tail -n 1 "$out/rank0.txt" | grep -E '^[0-9.]+ [0-9.]+$' || echo "na na"
  rm -rf "$out"
}
