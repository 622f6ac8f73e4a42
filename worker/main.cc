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
#include "common/logging.h"
#include "common/daemon.h"
#include "common/rpc.h"
#include "common/security_flags.h"
#include "worker/agent.h"
#include "worker/engine/cpu/model.h"

namespace {

std::atomic<bool> g_stop{false};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "weft-worker: %s\n", std::string(status.message()).c_str());
  return 1;
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

}  // namespace

int main(int argc, char** argv) {
  std::string coordinator = std::getenv("WEFT_COORDINATOR") ? std::getenv("WEFT_COORDINATOR")
                                                            : "127.0.0.1:7070";
  std::string device = "cpu";
  std::string host = HostName();
  std::string worker_id;
  std::string data_address;
  std::string metrics_address = "127.0.0.1:0";
  std::string metrics_port_file;
  std::string output_dir = "weft-models";
  std::string checkpointd = std::getenv("WEFT_CHECKPOINTD") ? std::getenv("WEFT_CHECKPOINTD") : "";
  int blas_threads = 1;
  double peak_tflops = 0;
  int64_t collective_timeout_ms = 60000;
  std::string log_level = "info";

  CLI::App app{"weft-worker: trains the job generations the coordinator assigns"};
  app.add_option("--coordinator", coordinator, "coordinator host:port (env WEFT_COORDINATOR)")
      ->capture_default_str();
  app.add_option("--device", device, "cpu, cpu:N (N-th CPU worker on this host) or cuda:N")
      ->capture_default_str();
  app.add_option("--host", host, "host name reported to the coordinator")->capture_default_str();
  app.add_option("--worker-id", worker_id, "stable id (default <host>/<device>)");
  app.add_option("--data-address", data_address,
                 "address other ranks reach this worker at for collectives (default: 127.0.0.1 "
                 "with a loopback coordinator, else --host)");
  app.add_option("--metrics-address", metrics_address, "Prometheus endpoint host:port, or none")
      ->capture_default_str();
  app.add_option("--metrics-port-file", metrics_port_file, "write the bound metrics port here");
  app.add_option("--checkpointd", checkpointd,
                 "checkpointd host:port for saving and restoring checkpoints (env "
                 "WEFT_CHECKPOINTD); none: no checkpoints");
  app.add_option("--output-dir", output_dir, "where rank 0 writes trained models")
      ->capture_default_str();
  app.add_option("--peak-tflops", peak_tflops,
                 "peak TFLOP/s of the device, for MFU (default: 989 on CUDA, the H100/H200 "
                 "dense bf16 figure; 0.05 per BLAS thread on CPU, a nominal figure)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--blas-threads", blas_threads, "OpenBLAS threads for CPU matmuls")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--collective-timeout-ms", collective_timeout_ms,
                 "a collective not done by then fails the generation")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  weft::SecurityFlags security;
  weft::AddSecurityFlags(app, &security);
  CLI11_PARSE(app, argc, argv);

  if (auto s = weft::InitLogging("worker", log_level); !s.ok()) return Fail(s);
  if (auto s = weft::InstallSecurity(security); !s.ok()) return Fail(s);
  if (auto s = weft::CheckHostPort(coordinator, "--coordinator"); !s.ok()) return Fail(s);
  weft::worker::AgentOptions options;
  options.coordinator = coordinator;
  if (auto s = ParseDevice(device, &options.info); !s.ok()) return Fail(s);
  options.info.set_host(host);
  // The coordinator would pick the same default; knowing it before registering labels this
  // worker's metrics and logs with its real id from the start.
  if (worker_id.empty()) {
    const bool cuda = options.info.device_kind() == weft::v1::DEVICE_KIND_CUDA;
    worker_id = absl::StrCat(host, "/", cuda ? "cuda" : "cpu", options.info.device_index());
  }
  options.info.set_worker_id(worker_id);
  options.info.set_pid(::getpid());
  if (data_address.empty()) {
    data_address = weft::IsLoopbackAddress(coordinator) ? "127.0.0.1" : host;
  }
  options.info.set_address(data_address);
  options.run.data_address = data_address;
  options.run.output_dir = output_dir;
  options.run.collective_timeout_ms = collective_timeout_ms;
  if (options.info.device_kind() == weft::v1::DEVICE_KIND_CUDA) {
    options.run.cuda_device = options.info.device_index();
  }
  if (peak_tflops == 0) {
    peak_tflops = options.info.device_kind() == weft::v1::DEVICE_KIND_CUDA ? 989.0
                                                                          : 0.05 * blas_threads;
  }
  options.run.peak_flops = peak_tflops * 1e12;
  if (!checkpointd.empty() && checkpointd != "none") {
    if (auto s = weft::CheckHostPort(checkpointd, "--checkpointd"); !s.ok()) return Fail(s);
    options.run.checkpointd = checkpointd;
  }
  weft::engine::cpu::SetBlasThreads(blas_threads);

  // Before any thread starts, so that only the signal thread below takes SIGINT/SIGTERM.
  weft::BlockShutdownSignals();
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics = weft::StartMetrics(metrics_address, metrics_port_file, registry);
  if (!metrics.ok()) return Fail(metrics.status());
  if (*metrics) {
    options.info.set_metrics_address(absl::StrCat(
        metrics_address.substr(0, metrics_address.rfind(':')), ":", (*metrics)->port()));
  }

  // SIGTERM/SIGINT end the worker cleanly: the run is aborted, the process exits.
  std::thread signal_thread([] {
    weft::WaitForShutdownSignal();
    g_stop = true;
  });
  signal_thread.detach();

  weft::worker::WorkerAgent agent(options, registry);
  absl::Status status = agent.Run(g_stop);
  if (!status.ok()) return Fail(status);
  return 0;
}
