// Where a worker stands among hosts: which machine it is on (its host identity) and how its
// collectives reach the other machines. Read once at start-up, from the machine and the flags,
// before any thread starts; the result travels in WorkerInfo (host_id, comm) so that the
// coordinator groups ranks by machine and `trainctl workers` shows what each worker applied.
#ifndef WEFT_WORKER_HOST_IDENTITY_H_
#define WEFT_WORKER_HOST_IDENTITY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "weft/v1/worker.pb.h"

namespace weft::worker {

// Where systemd and D-Bus keep the machine id, in the order they are tried.
const std::vector<std::string>& DefaultMachineIdPaths();

// The machine id (machine-id(5): 32 lowercase hex digits, then a newline) held by the first of
// `paths` that holds a valid one. It names the installation, not the host name, so renaming a
// host keeps it. NOT_FOUND naming each file and what was wrong with it (missing, empty — as in
// containers built without systemd —, or not 32 hex digits) when none does.
absl::StatusOr<std::string> ReadMachineId(const std::vector<std::string>& paths);

// The IPv4 address of network interface `name`, e.g. "10.1.2.3". NOT_FOUND listing the
// interfaces the machine has when there is no such interface, FAILED_PRECONDITION when it has
// no IPv4 address.
absl::StatusOr<std::string> InterfaceIpv4Address(const std::string& name);

// OK when this machine can listen on `address` (an IP address or a name resolving to one of
// its addresses): Gloo binds its listening socket there, and an address of another machine
// would otherwise fail every generation the worker joins, long after it registered.
// FAILED_PRECONDITION naming the address and what bind(2) or the resolver said.
absl::Status CheckCanListenOn(const std::string& address);

// Whether every address `address` resolves to is a loopback one (127.0.0.0/8, ::1). Debian's
// /etc/hosts maps the host name to 127.0.1.1, so a worker that advertises its host name is
// unreachable from other hosts; false when it does not resolve.
bool ResolvesOnlyToLoopback(const std::string& address);

// The cross-host settings a person gives a worker.
struct CommFlags {
  // --net-interface: one interface name (NCCL_SOCKET_IFNAME; Gloo listens on its address).
  std::string network_interface;
  // --nccl-ib-hca: NCCL_IB_HCA, e.g. "mlx5_0,mlx5_1" or "=mlx5_0:1".
  std::string ib_hcas;
  // --nccl-socket-threads: NCCL_SOCKET_NTHREADS, 0 (NCCL's default) or 1-16.
  int32_t socket_threads = 0;
  // --nccl-env, repeatable: any other NCCL variable, "NCCL_NAME=value".
  std::vector<std::string> nccl_env;
};

// The settings `flags` ask for on top of `environment` (the process's "NAME=value" strings):
// nccl_env holds every NCCL_* variable NCCL will read once they are applied, the flags winning
// over inherited variables. INVALID_ARGUMENT naming the flag and what is wrong: an interface
// list where one name is needed, threads out of range, a --nccl-env item that is not
// NCCL_NAME=value, or one that sets a variable a dedicated flag also sets.
absl::StatusOr<weft::v1::CommSettings> ResolveCommSettings(
    const CommFlags& flags, const std::vector<std::string>& environment);

// This process's environment as "NAME=value" strings.
std::vector<std::string> ProcessEnvironment();

// Sets every variable of settings.nccl_env in this process's environment. setenv is not
// thread-safe and NCCL reads its variables once: call it before any thread starts.
absl::Status ApplyCommSettings(const weft::v1::CommSettings& settings);

}  // namespace weft::worker

#endif  // WEFT_WORKER_HOST_IDENTITY_H_
