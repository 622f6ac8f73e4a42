// weft-checkpointd: sharded, resharding-capable checkpoint store of a Weft cluster.
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/synchronization/notification.h"
#include "checkpointd/service.h"
#include "checkpointd/store.h"
#include "common/daemon.h"
#include "common/daemon_flags.h"
#include "common/metrics.h"
#include "common/security_flags.h"
#include "spdlog/spdlog.h"

namespace {

constexpr char kProgram[] = "weft-checkpointd";

struct Flags {
  weft::DaemonFlags daemon = {
      .serving = {.listen = "127.0.0.1:7071", .metrics_address = "127.0.0.1:9471"}};
  int64_t gc_grace_seconds = 3600;
  int64_t sweep_interval_seconds = 60;
  std::string auth_tokens_file;
  weft::checkpointd::StoreOptions options;
};

void AddFlags(CLI::App& app, Flags* flags) {
  weft::AddDaemonFlags(app, &flags->daemon);
  weft::AddAuthTokensFlag(app, &flags->auth_tokens_file);
  app.add_option("--data-dir", flags->options.data_dir,
                 "directory of the checkpoint store (created if missing; locked: one checkpointd "
                 "a directory); the default is /var/lib/weft/checkpoints for root, else "
                 "$XDG_STATE_HOME/weft/checkpoints or ~/.local/state/weft/checkpoints")
      ->capture_default_str();
  app.add_option("--gc-grace-seconds", flags->gc_grace_seconds,
                 "uncommitted checkpoint data older than this is deleted")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{30} * 86400));
  app.add_option("--sweep-interval-seconds", flags->sweep_interval_seconds,
                 "period of the sweep for uncommitted data")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  app.add_option("--disk-reserve-bytes", flags->options.disk_reserve_bytes,
                 "free space on the data directory's disk that checkpoint data never uses (kept "
                 "for the store's own files, commits and deletes); a shard that would leave "
                 "less is refused with RESOURCE_EXHAUSTED. A quarter of it is held as a ballast "
                 "file, removed when the disk is found full so the store still opens and "
                 "deletes")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  flags.options.data_dir = weft::DefaultDataDir("checkpoints");
  CLI::App app{"weft-checkpointd: sharded checkpoint store"};
  AddFlags(app, &flags);
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = weft::StartDaemonProcess("checkpointd", flags.daemon); !s.ok()) {
    return weft::ExitWithError(kProgram, s);
  }
  flags.options.gc_grace = absl::Seconds(flags.gc_grace_seconds);
  auto auth = weft::LoadAuthTokens(flags.auth_tokens_file);
  if (!auth.ok()) return weft::ExitWithError(kProgram, auth.status());

  // Held until exit: two checkpointds on one directory would each sweep the other's data.
  auto data_dir = weft::DataDirLock::Acquire(flags.options.data_dir, kProgram);
  if (!data_dir.ok()) return weft::ExitWithError(kProgram, data_dir.status());
  flags.options.data_dir = (*data_dir)->dir();

  auto registry = std::make_shared<prometheus::Registry>();
  auto store = weft::checkpointd::CheckpointStore::Open(flags.options, registry);
  if (!store.ok()) return weft::ExitWithError(kProgram, store.status());

  weft::checkpointd::CheckpointService service(store->get(), *auth);
  auto daemon = weft::ServingDaemon::Start(flags.daemon.serving, registry, {&service});
  if (!daemon.ok()) return weft::ExitWithError(kProgram, daemon.status());
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
