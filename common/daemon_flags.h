// What every Weft daemon's main() shares before and after its own flags: the serving flags
// (serving_flags.h), the security flags (security_flags.h) and --log-level; then, once parsed,
// logging, security, the open-file limit and shutdown signals, in that order.
// Header-only for the same reason as serving_flags.h: weft_common does not link CLI11.
#ifndef WEFT_COMMON_DAEMON_FLAGS_H_
#define WEFT_COMMON_DAEMON_FLAGS_H_

#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "common/daemon.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/security_flags.h"
#include "common/serving_flags.h"

namespace weft {

struct DaemonFlags {
  ServingOptions serving;  // set its defaults (listen and metrics addresses) before adding
  std::string log_level = "info";
  SecurityFlags security;
};

// Adds --listen, --port-file, --metrics-address, --metrics-port-file, --log-level and the
// security flags, bound to `flags`.
inline void AddDaemonFlags(CLI::App& app, DaemonFlags* flags) {
  AddServingFlags(app, &flags->serving);
  app.add_option("--log-level", flags->log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  AddSecurityFlags(app, &flags->security);
}

// After parsing, before any thread starts: logs as `component`, installs the process's
// security, raises the open-file limit and blocks SIGINT/SIGTERM for WaitForShutdownSignal.
inline absl::Status StartDaemonProcess(const std::string& component, const DaemonFlags& flags) {
  if (absl::Status s = InitLogging(component, flags.log_level); !s.ok()) return s;
  if (absl::Status s = InstallSecurity(flags.security); !s.ok()) return s;
  RaiseOpenFileLimit();
  BlockShutdownSignals();
  return absl::OkStatus();
}

// Prints "<program>: <message>" on stderr; returns main()'s exit status, 1.
inline int ExitWithError(const char* program, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", program, std::string(status.message()).c_str());
  return 1;
}

}  // namespace weft

#endif  // WEFT_COMMON_DAEMON_FLAGS_H_
