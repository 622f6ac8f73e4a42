// weft-worker: one process per device. Registers with the coordinator, heartbeats, and trains
// the job generations it is assigned.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "CLI/CLI.hpp"
#ifdef WEFT_WORKER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/security_flags.h"
#include "common/serving_flags.h"
#include "common/status.h"
#include "common/status_context.h"
#include "common/version.h"
#include "spdlog/spdlog.h"
#include "worker/agent.h"
#include "worker/engine/cpu/model.h"
#include "worker/host_identity.h"

namespace {

std::atomic<bool> g_stop{false};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "weft-worker: %s\n", std::string(status.message()).c_str());
  return 1;
}

// nvidia-smi's spelling of a GPU's UUID: "GPU-" and its 16 bytes as 8-4-4-4-12 hex digits.
std::string GpuUuid(const char (&bytes)[16]) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(&out, absl::Hex(static_cast<unsigned char>(bytes[i]), absl::kZeroPad2));
  }
  return out;
}

// "cpu", "cpu:N" or "cuda:N".
absl::Status ParseDevice(const std::string& device, weft::v1::WorkerInfo* info) {
  const size_t colon = device.find(':');
  const std::string kind = device.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos && !absl::SimpleAtoi(device.substr(colon + 1), &index)) {
    index = -1;
  }
  if ((kind != "cpu" && kind != "cuda") || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: \"", device, "\" is not cpu, cpu:N or cuda:N"));
  }
  info->set_device_index(index);
  if (kind == "cpu") {
    info->set_device_kind(weft::v1::DEVICE_KIND_CPU);
    return absl::OkStatus();
  }
#ifdef WEFT_WORKER_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (index >= count) {
    return absl::FailedPreconditionError(absl::StrCat("--device ", device, ": this host has ",
                                                      count, " CUDA device(s)"));
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) {
    info->set_gpu_model(prop.name);
    info->set_gpu_memory_bytes(static_cast<int64_t>(prop.totalGlobalMem));
    info->set_gpu_uuid(GpuUuid(prop.uuid.bytes));
  }
  info->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  return absl::OkStatus();
#else
  return absl::UnimplementedError(
      absl::StrCat("--device ", device, ": this weft-worker was built without CUDA (no nvcc "
                   "at build time); use --device cpu"));
#endif
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

struct Flags {
  std::string coordinator = EnvOr("WEFT_COORDINATOR", "127.0.0.1:7070");
  std::string device = "cpu";
  std::string host = HostName();
  std::string host_id;
  std::string worker_id;
  std::string data_address;
  std::string metrics_address = "127.0.0.1:0";
  std::string metrics_port_file;
  std::string output_dir = "weft-models";
  std::string checkpointd = EnvOr("WEFT_CHECKPOINTD", "");
  int blas_threads = 1;
  double peak_tflops = 0;
  int64_t collective_timeout_ms = 60000;
  weft::worker::CheckpointTimeouts checkpoint_timeouts;
  int64_t test_teardown_delay_ms = 0;
  std::string test_version;
  std::string log_level = "info";
  weft::SecurityFlags security;
  weft::worker::CommFlags comm;
  weft::KeepaliveOptions keepalive = weft::kDefaultKeepalive;  // to the coordinator
};

// Where this worker is and how it is reached.
void AddPlacementFlags(CLI::App& app, Flags& f) {
  app.add_option("--coordinator", f.coordinator, "coordinator host:port (env WEFT_COORDINATOR)")
      ->capture_default_str();
  app.add_option("--device", f.device, "cpu, cpu:N (N-th CPU worker on this host) or cuda:N")
      ->capture_default_str();
  app.add_option("--host", f.host, "host name reported to the coordinator")
      ->capture_default_str();
  app.add_option("--host-id", f.host_id,
                 "the machine this worker runs on: the coordinator keeps a machine's ranks "
                 "contiguous and groups hybrid sharding by it (default: the machine id, "
                 "/etc/machine-id, else --host; in containers pass the node's name)");
  app.add_option("--worker-id", f.worker_id, "stable id (default <host>/<device>)");
  app.add_option("--data-address", f.data_address,
                 "address other ranks reach this worker at for collectives (default: 127.0.0.1 "
                 "with a loopback coordinator, else --host)");
  app.add_option("--metrics-address", f.metrics_address, "Prometheus endpoint host:port, or none")
      ->capture_default_str();
  app.add_option("--metrics-port-file", f.metrics_port_file, "write the bound metrics port here");
}

// How this worker's collectives reach other hosts (WorkerInfo.comm).
void AddNetworkFlags(CLI::App& app, Flags& f) {
  app.add_option("--net-interface", f.comm.network_interface,
                 "network interface for collectives: NCCL_SOCKET_IFNAME, and Gloo listens on its "
                 "IPv4 address unless --data-address is given");
  app.add_option("--nccl-ib-hca", f.comm.ib_hcas,
                 "InfiniBand HCAs NCCL may use (NCCL_IB_HCA), e.g. mlx5_0,mlx5_1");
  app.add_option("--nccl-socket-threads", f.comm.socket_threads,
                 "threads per NCCL socket connection (NCCL_SOCKET_NTHREADS), 1-16; 0: NCCL's "
                 "default")
      ->capture_default_str();
  app.add_option("--nccl-env", f.comm.nccl_env,
                 "another NCCL variable, NCCL_NAME=value (repeatable); shown by trainctl workers "
                 "with the NCCL_* variables inherited from the environment");
}

// The host id a worker states when --host-id is not given.
std::string DefaultHostId(const std::string& host) {
  absl::StatusOr<std::string> id = weft::worker::ReadMachineId(
      weft::worker::DefaultMachineIdPaths());
  if (id.ok()) return *id;
  spdlog::warn("--host-id not given and {}: using the host name \"{}\" as this machine's id",
               std::string(id.status().message()), host);
  return host;
}

// How this worker trains and keeps what it trained.
void AddTrainingFlags(CLI::App& app, Flags& f) {
  app.add_option("--checkpointd", f.checkpointd,
                 "checkpointd host:port for saving and restoring checkpoints (env "
                 "WEFT_CHECKPOINTD); none: no checkpoints");
  app.add_option("--output-dir", f.output_dir, "where rank 0 writes trained models")
      ->capture_default_str();
  app.add_option("--peak-tflops", f.peak_tflops,
                 "peak TFLOP/s of the device, for MFU (default: 989 on CUDA, the H100/H200 "
                 "dense bf16 figure; 0.05 per BLAS thread on CPU, a nominal figure)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--blas-threads", f.blas_threads, "OpenBLAS threads for CPU matmuls")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
}

// A timeout flag in milliseconds, from 100 ms to `max_ms`.
void AddTimeoutMsFlag(CLI::App& app, const std::string& name, int64_t& value,
                      const std::string& help, int64_t max_ms) {
  app.add_option(name, value, help)->capture_default_str()->check(
      CLI::Range(int64_t{100}, max_ms));
}

// How long this worker waits for its peers before giving up.
void AddTimeoutFlags(CLI::App& app, Flags& f) {
  constexpr int64_t kHourMs = 3600 * 1000;
  AddTimeoutMsFlag(app, "--collective-timeout-ms", f.collective_timeout_ms,
                   "a collective not done by then fails the generation", kHourMs);
  AddTimeoutMsFlag(app, "--restore-wait-timeout-ms", f.checkpoint_timeouts.restore_wait_timeout_ms,
                   "how long a rank waits for rank 0 to list the checkpoints to restore",
                   24 * kHourMs);
  AddTimeoutMsFlag(app, "--checkpoint-commit-timeout-ms", f.checkpoint_timeouts.commit_timeout_ms,
                   "how long rank 0 waits for every rank's shard before giving a checkpoint "
                   "up, and every rank at the end of training for every rank's last upload",
                   24 * kHourMs);
  // Test-only (tests/worker/slow_teardown_e2e_test.cc): stands for a run whose teardown is
  // slow, such as an upload finishing. Hidden from --help.
  app.add_option("--test-teardown-delay-ms", f.test_teardown_delay_ms)
      ->group("")
      ->check(CLI::Range(int64_t{0}, int64_t{600000}));
  // Test-only: the release this worker states, so a test can mix releases. Hidden.
  app.add_option("--test-version", f.test_version)->group("");
}

// The address other ranks reach this worker at: --data-address, else --net-interface's
// address, else 127.0.0.1 under a loopback coordinator, else --host. A CPU worker's Gloo
// listens there, so it must be one of this machine's.
absl::StatusOr<std::string> DataAddress(const Flags& f, bool cuda) {
  std::string address = f.data_address;
  std::string from = "--data-address";
  if (address.empty() && !f.comm.network_interface.empty()) {
    WEFT_ASSIGN_OR_RETURN_CONTEXT(address,
                                  weft::worker::InterfaceIpv4Address(f.comm.network_interface),
                                  "--net-interface");
    from = "the data address (of --net-interface)";
  }
  if (address.empty()) {
    address = weft::IsLoopbackAddress(f.coordinator) ? "127.0.0.1" : f.host;
    from = "the data address (by default --host; pass --data-address or --net-interface)";
  }
  if (cuda) return address;  // NCCL picks its own interface (--net-interface)
  WEFT_RETURN_IF_ERROR_CONTEXT(weft::worker::CheckCanListenOn(address), from);
  if (!weft::IsLoopbackAddress(f.coordinator) && weft::worker::ResolvesOnlyToLoopback(address)) {
    spdlog::warn("the data address \"{}\" is a loopback address: workers on other hosts "
                 "cannot reach this one; pass --net-interface or --data-address",
                 address);
  }
  return address;
}

// The agent's options from the flags; the checks a flag's own validator cannot make.
absl::StatusOr<weft::worker::AgentOptions> ToAgentOptions(Flags f) {
  WEFT_RETURN_IF_ERROR(weft::CheckHostPort(f.coordinator, "--coordinator"));
  weft::worker::AgentOptions options;
  options.coordinator = f.coordinator;
  options.keepalive = f.keepalive;
  WEFT_RETURN_IF_ERROR(ParseDevice(f.device, &options.info));
  options.info.set_host(f.host);
  options.info.set_host_id(f.host_id.empty() ? DefaultHostId(f.host) : f.host_id);
  WEFT_ASSIGN_OR_RETURN(*options.info.mutable_comm(),
                        weft::worker::ResolveCommSettings(f.comm,
                                                          weft::worker::ProcessEnvironment()));
  // Before any thread starts, and before NCCL reads them.
  WEFT_RETURN_IF_ERROR(weft::worker::ApplyCommSettings(options.info.comm()));
  const bool cuda = options.info.device_kind() == weft::v1::DEVICE_KIND_CUDA;
  // The coordinator would pick the same default; knowing it before registering labels this
  // worker's metrics and logs with its real id from the start.
  if (f.worker_id.empty()) {
    f.worker_id = absl::StrCat(f.host, "/", cuda ? "cuda" : "cpu", options.info.device_index());
  }
  options.info.set_worker_id(f.worker_id);
  options.info.set_pid(::getpid());
  WEFT_ASSIGN_OR_RETURN(f.data_address, DataAddress(f, cuda));
  options.info.set_address(f.data_address);
  weft::worker::RunOptions& run = options.run;
  run.device.data_address = f.data_address;
  run.device.collective_timeout_ms = f.collective_timeout_ms;
  if (cuda) run.device.cuda_device = options.info.device_index();
  run.output_dir = f.output_dir;
  if (f.peak_tflops == 0) f.peak_tflops = cuda ? 989.0 : 0.05 * f.blas_threads;
  run.peak_flops = f.peak_tflops * 1e12;
  if (!f.checkpointd.empty() && f.checkpointd != "none") {
    WEFT_RETURN_IF_ERROR(weft::CheckHostPort(f.checkpointd, "--checkpointd"));
    run.checkpointd = f.checkpointd;
    options.info.set_checkpointd(f.checkpointd);
  }
  options.info.set_version(f.test_version.empty() ? weft::kVersion : f.test_version);
  run.checkpoint_timeouts = f.checkpoint_timeouts;
  run.test_teardown_delay_ms = f.test_teardown_delay_ms;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"weft-worker: trains the job generations the coordinator assigns"};
  AddPlacementFlags(app, flags);
  AddNetworkFlags(app, flags);
  AddTrainingFlags(app, flags);
  AddTimeoutFlags(app, flags);
  weft::AddKeepaliveFlags(app, &flags.keepalive, "the coordinator");
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  weft::AddSecurityFlags(app, &flags.security);
  CLI11_PARSE(app, argc, argv);

  if (auto s = weft::InitLogging("worker", flags.log_level); !s.ok()) return Fail(s);
  if (auto s = weft::InstallSecurity(flags.security); !s.ok()) return Fail(s);
  auto options = ToAgentOptions(flags);
  if (!options.ok()) return Fail(options.status());
  weft::engine::cpu::SetBlasThreads(flags.blas_threads);

  // Before any thread starts, so that only the signal thread below takes SIGINT/SIGTERM.
  weft::BlockShutdownSignals();
  auto registry = std::make_shared<prometheus::Registry>();
  // The port file is written below, once the agent has registered its metrics: a scrape that
  // follows the file must find the weft_worker_ families.
  auto metrics = weft::StartMetrics(flags.metrics_address, /*port_file=*/"", registry);
  if (!metrics.ok()) return Fail(metrics.status());
  if (*metrics) {
    const std::string& address = flags.metrics_address;
    options->info.set_metrics_address(
        absl::StrCat(address.substr(0, address.rfind(':')), ":", (*metrics)->port()));
  }

  // SIGTERM/SIGINT end the worker cleanly: the run is aborted, the process exits.
  std::thread signal_thread([] {
    weft::WaitForShutdownSignal();
    g_stop = true;
  });
  signal_thread.detach();

  weft::worker::WorkerAgent agent(*options, registry);
  if (*metrics && !flags.metrics_port_file.empty()) {
    if (auto s = weft::WriteFileAtomically(flags.metrics_port_file,
                                           absl::StrCat((*metrics)->port(), "\n"));
        !s.ok()) {
      return Fail(s);
    }
  }
  absl::Status status = agent.Run(g_stop);
  if (!status.ok()) return Fail(status);
  return 0;
}
