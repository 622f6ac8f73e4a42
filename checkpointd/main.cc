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
#include "common/daemon.h"
#include "common/serving_flags.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "common/security_flags.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace {

struct Flags {
  weft::ServingOptions serving = {.listen = "127.0.0.1:7071",
                                  .metrics_address = "127.0.0.1:9471"};
  std::string log_level = "info";
  int64_t gc_grace_seconds = 3600;
  int64_t sweep_interval_seconds = 60;
  weft::checkpointd::StoreOptions options;
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "weft-checkpointd: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"weft-checkpointd: sharded checkpoint store"};
  weft::AddServingFlags(app, &flags.serving);
  app.add_option("--data-dir", flags.options.data_dir, "directory of the checkpoint store")
      ->capture_default_str();
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
  weft::SecurityFlags security;
  weft::AddSecurityFlags(app, &security);
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = weft::InitLogging("checkpointd", flags.log_level); !s.ok()) return Fail(s);
  if (absl::Status s = weft::InstallSecurity(security); !s.ok()) return Fail(s);
  flags.options.gc_grace = absl::Seconds(flags.gc_grace_seconds);
  weft::RaiseOpenFileLimit();
  weft::BlockShutdownSignals();

  auto registry = std::make_shared<prometheus::Registry>();
  auto store = weft::checkpointd::CheckpointStore::Open(flags.options, registry);
  if (!store.ok()) return Fail(store.status());

  weft::checkpointd::CheckpointService service(store->get());
  auto daemon = weft::ServingDaemon::Start(flags.serving, registry, {&service});
  if (!daemon.ok()) return Fail(daemon.status());
  spdlog::info("serving on port {} (metrics on {}), store in {}", (*daemon)->port(),
               (*daemon)->metrics_port_text(), flags.options.data_dir);

  // Uncommitted data of writers that vanished is collected in the background.
  absl::Notification stop;
  std::thread sweeper([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Seconds(flags.sweep_interval_seconds))) {
      if (absl::Status s = (*store)->Sweep(); !s.ok()) {
        spdlog::warn("sweep failed: {}", std::string(s.message()));
      }
    }
  });

  const int signo = weft::WaitForShutdownSignal();
  spdlog::info("signal {}: shutting down", signo);
  stop.Notify();
  sweeper.join();
  (*daemon)->Shutdown(absl::Seconds(5));
  store->reset();  // flushes the store before exit
  return 0;
}
