// weft-checkpointd: sharded, resharding-capable checkpoint store of a Weft cluster.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "checkpointd/service.h"
#include "checkpointd/store.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace {

struct Flags {
  std::string listen = "127.0.0.1:7071";
  std::string port_file;
  std::string metrics_address = "127.0.0.1:9471";
  std::string metrics_port_file;
  std::string log_level = "info";
  int64_t gc_grace_seconds = 3600;
  int64_t sweep_interval_seconds = 60;
  weft::checkpointd::StoreOptions options;
};

bool IsLoopback(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:");
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "weft-checkpointd: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"weft-checkpointd: sharded checkpoint store"};
  app.add_option("--listen", flags.listen, "gRPC address host:port (port 0 picks one)")
      ->capture_default_str();
  app.add_option("--port-file", flags.port_file,
                 "write the bound gRPC port here once serving (for scripts and tests)");
  app.add_option("--data-dir", flags.options.data_dir, "directory of the checkpoint store")
      ->capture_default_str();
  app.add_option("--metrics-address", flags.metrics_address,
                 "Prometheus endpoint host:port, or none")
      ->capture_default_str();
  app.add_option("--metrics-port-file", flags.metrics_port_file,
                 "write the bound metrics port here");
  app.add_option("--gc-grace-seconds", flags.gc_grace_seconds,
                 "uncommitted checkpoint data older than this is deleted")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{30} * 86400));
  app.add_option("--sweep-interval-seconds", flags.sweep_interval_seconds,
                 "period of the sweep for uncommitted data")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = weft::InitLogging("checkpointd", flags.log_level); !s.ok()) return Fail(s);
  if (absl::Status s = weft::CheckHostPort(flags.listen, "--listen"); !s.ok()) return Fail(s);
  if (!IsLoopback(flags.listen)) {
    spdlog::warn("serving plaintext gRPC on non-loopback address {}", flags.listen);
  }
  flags.options.gc_grace = absl::Seconds(flags.gc_grace_seconds);
  weft::RaiseOpenFileLimit();

  // Signals are taken synchronously by the main thread; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto registry = std::make_shared<prometheus::Registry>();
  auto store = weft::checkpointd::CheckpointStore::Open(flags.options, registry);
  if (!store.ok()) return Fail(store.status());

  std::unique_ptr<weft::MetricsEndpoint> metrics;
  if (flags.metrics_address != "none" && !flags.metrics_address.empty()) {
    auto endpoint = weft::MetricsEndpoint::Start(flags.metrics_address, registry);
    if (!endpoint.ok()) return Fail(endpoint.status());
    metrics = std::move(*endpoint);
  }

  weft::checkpointd::CheckpointService service(store->get());
  grpc::ServerBuilder builder;
  weft::ConfigureServerBuilder(&builder);
  int port = 0;
  builder.AddListeningPort(flags.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail(absl::UnavailableError(absl::StrCat("--listen ", flags.listen,
                                                    ": cannot listen (address in use?)")));
  }
  if (!flags.port_file.empty()) {
    if (auto s = weft::WriteFileAtomically(flags.port_file, absl::StrCat(port, "\n")); !s.ok()) {
      return Fail(s);
    }
  }
  if (metrics && !flags.metrics_port_file.empty()) {
    if (auto s = weft::WriteFileAtomically(flags.metrics_port_file,
                                           absl::StrCat(metrics->port(), "\n"));
        !s.ok()) {
      return Fail(s);
    }
  }
  spdlog::info("serving on port {} (metrics on {}), store in {}", port,
               metrics ? absl::StrCat(metrics->port()) : std::string("none"),
               flags.options.data_dir);

  // Uncommitted data of writers that vanished is collected in the background.
  absl::Notification stop;
  std::thread sweeper([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Seconds(flags.sweep_interval_seconds))) {
      if (absl::Status s = (*store)->Sweep(); !s.ok()) {
        spdlog::warn("sweep failed: {}", std::string(s.message()));
      }
    }
  });

  int signo = 0;
  sigwait(&signals, &signo);
  spdlog::info("signal {}: shutting down", signo);
  stop.Notify();
  sweeper.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  store->reset();  // flushes the store before exit
  return 0;
}
