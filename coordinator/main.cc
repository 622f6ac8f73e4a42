// weft-coordinator: job queue, worker registry, rendezvous and store for a Weft cluster.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/daemon.h"
#include "common/security_flags.h"
#include "common/serving_flags.h"
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
  weft::ServingOptions serving = {.listen = "127.0.0.1:7070",
                                  .metrics_address = "127.0.0.1:9470"};
  std::string log_level = "info";
  weft::SecurityFlags security;
  std::string auth_tokens_file;
  weft::coordinator::CoordinatorOptions options;
  int64_t shutdown_grace_ms = 5000;
};

// An option whose default is shown in --help and whose value must lie in [lo, hi].
template <typename T>
void AddBounded(CLI::App& app, const char* name, T* value, const char* help,
                std::type_identity_t<T> lo, std::type_identity_t<T> hi) {
  app.add_option(name, *value, help)->capture_default_str()->check(CLI::Range(lo, hi));
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "weft-coordinator: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  flags.options.data_dir = weft::DefaultDataDir("coordinator");
  CLI::App app{"weft-coordinator: job queue, worker registry, rendezvous and store"};
  weft::AddServingFlags(app, &flags.serving);
  weft::AddSecurityFlags(app, &flags.security);
  weft::AddAuthTokensFlag(app, &flags.auth_tokens_file);
  app.add_option("--data-dir", flags.options.data_dir,
                 "directory of the state database (created if missing; locked: one coordinator "
                 "a directory); the default is /var/lib/weft/coordinator for root, else "
                 "$XDG_STATE_HOME/weft/coordinator or ~/.local/state/weft/coordinator")
      ->capture_default_str();
  AddBounded(app, "--heartbeat-interval-ms", &flags.options.heartbeat_interval_ms,
             "heartbeat interval of idle workers", 10, 600000);
  AddBounded(app, "--heartbeat-timeout-ms", &flags.options.heartbeat_timeout_ms,
             "idle workers silent this long are declared dead", 20, 3600000);
  AddBounded(app, "--max-idle-heartbeats-per-s", &flags.options.max_idle_heartbeats_per_s,
             "past this many idle heartbeats a second, the idle interval and timeout stretch "
             "in proportion (0: never)",
             0, 10000000);
  AddBounded(app, "--rendezvous-timeout-ms", &flags.options.rendezvous_timeout_ms,
             "a generation whose members have not all joined by then fails", 100, 86400000);
  AddBounded(app, "--connection-lost-grace-ms", &flags.options.connection_lost_grace_ms,
             "a worker whose session (connection) dropped is dead after this long without a "
             "new session",
             0, 3600000);
  AddBounded(app, "--quarantine-after-failures", &flags.options.quarantine_after_failures,
             "quarantine a worker blamed for this many failed generations in a row (0: never)",
             0, 1000);
  AddBounded(app, "--quarantine-cooldown-ms", &flags.options.quarantine_cooldown_ms,
             "how long a quarantined worker is given no job", 0, 86400000);
  AddBounded(app, "--tick-interval-ms", &flags.options.tick_interval_ms,
             "period of liveness checks and scheduling", 5, 10000);
  AddBounded(app, "--shutdown-grace-ms", &flags.shutdown_grace_ms,
             "on SIGTERM/SIGINT, how long calls in progress may take to finish", 0, 600000);
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = weft::InitLogging("coordinator", flags.log_level); !s.ok()) return Fail(s);
  if (flags.options.heartbeat_timeout_ms <= flags.options.heartbeat_interval_ms) {
    return Fail(absl::InvalidArgumentError(
        "--heartbeat-timeout-ms: must be greater than --heartbeat-interval-ms"));
  }
  if (absl::Status s = weft::InstallSecurity(flags.security); !s.ok()) return Fail(s);
  auto auth = weft::LoadAuthTokens(flags.auth_tokens_file);
  if (!auth.ok()) return Fail(auth.status());
  weft::RaiseOpenFileLimit();
  weft::BlockShutdownSignals();
  // The distribution's Abseil is built with Mutex deadlock detection on, which records every
  // lock order in one global graph: at 10K workers (a mutex per parked call) that graph cost
  // the coordinator a tenth of its CPU. The unit tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Held until exit: a second coordinator on this directory would hand out the same job ids
  // and overwrite this one's jobs.
  auto data_dir = weft::DataDirLock::Acquire(flags.options.data_dir, "weft-coordinator");
  if (!data_dir.ok()) return Fail(data_dir.status());
  flags.options.data_dir = (*data_dir)->dir();

  auto registry = std::make_shared<prometheus::Registry>();
  auto coordinator = weft::coordinator::Coordinator::Open(flags.options, registry);
  if (!coordinator.ok()) return Fail(coordinator.status());

  weft::coordinator::CoordinatorService coordinator_service(coordinator->get(), *auth);
  weft::coordinator::StoreService store_service(coordinator->get(), *auth);
  auto daemon = weft::ServingDaemon::Start(flags.serving, registry,
                                           {&coordinator_service, &store_service});
  if (!daemon.ok()) return Fail(daemon.status());
  spdlog::info("serving on port {} (metrics on {}), state in {}", (*daemon)->port(),
               (*daemon)->metrics_port_text(), flags.options.data_dir);

  const int signo = weft::WaitForShutdownSignal();
  spdlog::info("signal {}: shutting down", signo);
  (*coordinator)->Shutdown();
  (*daemon)->Shutdown(absl::Milliseconds(flags.shutdown_grace_ms));
  return 0;
}
