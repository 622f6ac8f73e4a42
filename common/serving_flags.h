// The command-line flags of ServingOptions (common/daemon.h), the same in every daemon.
// Header-only so that weft_common does not depend on CLI11; daemons link CLI11 themselves.
#ifndef WEFT_COMMON_SERVING_FLAGS_H_
#define WEFT_COMMON_SERVING_FLAGS_H_

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"
#include "common/daemon.h"
#include "common/rpc.h"

namespace weft {

// Adds --keepalive-interval-ms and --keepalive-timeout-ms, bound to `keepalive` (whose
// current values are the defaults shown in --help). `peers` says whom the pings go to.
inline void AddKeepaliveFlags(CLI::App& app, KeepaliveOptions* keepalive,
                              const std::string& peers) {
  app.add_option("--keepalive-interval-ms", keepalive->interval_ms,
                 "HTTP/2 keepalive: ping " + peers + " this often (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}));
  app.add_option("--keepalive-timeout-ms", keepalive->timeout_ms,
                 "a connection whose ping is not acknowledged within this is closed as lost")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
}

// Adds --listen, --port-file, --metrics-address, --metrics-port-file and the keepalive
// flags, bound to `options` (whose current values are the defaults shown in --help).
inline void AddServingFlags(CLI::App& app, ServingOptions* options) {
  app.add_option("--listen", options->listen, "gRPC address host:port (port 0 picks one)")
      ->capture_default_str();
  app.add_option("--port-file", options->port_file,
                 "write the bound gRPC port here once serving (for scripts and tests)");
  app.add_option("--metrics-address", options->metrics_address,
                 "Prometheus endpoint host:port, or none")
      ->capture_default_str();
  app.add_option("--metrics-port-file", options->metrics_port_file,
                 "write the bound metrics port here");
  AddKeepaliveFlags(app, &options->keepalive, "every client");
}

}  // namespace weft

#endif  // WEFT_COMMON_SERVING_FLAGS_H_
