// weft-coordinator: job queue, worker registry, rendezvous and store for a Weft cluster.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace {

// Flags map one-to-one to this struct and CoordinatorOptions.
struct Flags {
  std::string listen = "127.0.0.1:7070";
  std::string port_file;
  std::string metrics_address = "127.0.0.1:9470";
  std::string metrics_port_file;
  std::string log_level = "info";
  weft::coordinator::CoordinatorOptions options;
};

bool IsLoopback(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:");
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "weft-coordinator: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  flags.options.data_dir = "weft-coordinator-data";
  CLI::App app{"weft-coordinator: job queue, worker registry, rendezvous and store"};
  app.add_option("--listen", flags.listen, "gRPC address host:port (port 0 picks one)")
      ->capture_default_str();
  app.add_option("--port-file", flags.port_file,
                 "write the bound gRPC port here once serving (for scripts and tests)");
  app.add_option("--data-dir", flags.options.data_dir, "directory of the state database")
      ->capture_default_str();
  app.add_option("--metrics-address", flags.metrics_address,
                 "Prometheus endpoint host:port, or none")
      ->capture_default_str();
  app.add_option("--metrics-port-file", flags.metrics_port_file,
                 "write the bound metrics port here");
  app.add_option("--heartbeat-interval-ms", flags.options.heartbeat_interval_ms,
                 "heartbeat interval of idle workers")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{600000}));
  app.add_option("--heartbeat-timeout-ms", flags.options.heartbeat_timeout_ms,
                 "idle workers silent this long are declared dead")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{20}, int64_t{3600000}));
  app.add_option("--rendezvous-timeout-ms", flags.options.rendezvous_timeout_ms,
                 "a generation whose members have not all joined by then fails")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{100}, int64_t{86400000}));
  app.add_option("--tick-interval-ms", flags.options.tick_interval_ms,
                 "period of liveness checks and scheduling")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{5}, int64_t{10000}));
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = weft::InitLogging("coordinator", flags.log_level); !s.ok()) return Fail(s);
  if (flags.options.heartbeat_timeout_ms <= flags.options.heartbeat_interval_ms) {
    return Fail(absl::InvalidArgumentError(
        "--heartbeat-timeout-ms: must be greater than --heartbeat-interval-ms"));
  }
  if (absl::Status s = weft::CheckHostPort(flags.listen, "--listen"); !s.ok()) return Fail(s);
  if (!IsLoopback(flags.listen)) {
    spdlog::warn("serving plaintext gRPC on non-loopback address {}", flags.listen);
  }
  weft::RaiseOpenFileLimit();

  // Signals are taken synchronously by the main thread; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto registry = std::make_shared<prometheus::Registry>();
  auto coordinator = weft::coordinator::Coordinator::Open(flags.options, registry);
  if (!coordinator.ok()) return Fail(coordinator.status());

  std::unique_ptr<weft::MetricsEndpoint> metrics;
  if (flags.metrics_address != "none" && !flags.metrics_address.empty()) {
    auto endpoint = weft::MetricsEndpoint::Start(flags.metrics_address, registry);
    if (!endpoint.ok()) return Fail(endpoint.status());
    metrics = std::move(*endpoint);
  }

  weft::coordinator::CoordinatorService coordinator_service(coordinator->get());
  weft::coordinator::StoreService store_service(coordinator->get());
  grpc::ServerBuilder builder;
  weft::ConfigureServerBuilder(&builder);
  int port = 0;
  builder.AddListeningPort(flags.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&coordinator_service);
  builder.RegisterService(&store_service);
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
  spdlog::info("serving on port {} (metrics on {}), state in {}", port,
               metrics ? absl::StrCat(metrics->port()) : std::string("none"),
               flags.options.data_dir);

  int signo = 0;
  sigwait(&signals, &signo);
  spdlog::info("signal {}: shutting down", signo);
  (*coordinator)->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return 0;
}
