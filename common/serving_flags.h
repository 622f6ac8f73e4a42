// The command-line flags of ServingOptions (common/daemon.h), the same in every daemon.
// Header-only so that weft_common does not depend on CLI11; daemons link CLI11 themselves.
#ifndef WEFT_COMMON_SERVING_FLAGS_H_
#define WEFT_COMMON_SERVING_FLAGS_H_

#include "CLI/CLI.hpp"
#include "common/daemon.h"

namespace weft {

// Adds --listen, --port-file, --metrics-address and --metrics-port-file, bound to `options`
// (whose current values are the defaults shown in --help).
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
}

}  // namespace weft

#endif  // WEFT_COMMON_SERVING_FLAGS_H_
