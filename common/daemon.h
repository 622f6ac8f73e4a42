// The serving skeleton every Weft daemon shares: shutdown signals, the Prometheus endpoint, the
// gRPC server, and the port files that scripts and tests read when a daemon binds port 0.
#ifndef WEFT_COMMON_DAEMON_H_
#define WEFT_COMMON_DAEMON_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "grpcpp/server.h"
#include "prometheus/registry.h"

namespace weft {

// Call at the top of main(), before any thread starts: SIGINT and SIGTERM are then delivered
// only to WaitForShutdownSignal().
void BlockShutdownSignals();
// Blocks until SIGINT or SIGTERM arrives; returns it.
int WaitForShutdownSignal();

// True for 127.x.x.x, localhost and [::1] addresses ("host:port").
bool IsLoopbackAddress(const std::string& address);

// Serves `registry` at `address` ("none" or empty: no endpoint, nullptr) and writes the bound
// port to `port_file` when given. Errors name --metrics-address / the file.
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetrics(
    const std::string& address, const std::string& port_file,
    std::shared_ptr<prometheus::Registry> registry);

// The --data-dir a daemon uses when none is given, for its data `name` ("coordinator",
// "checkpoints"): /var/lib/weft/<name> when run as root (where deploy/ puts it), else
// $XDG_STATE_HOME/weft/<name>, else ~/.local/state/weft/<name>. Always absolute: a relative
// default would put the data wherever the daemon happens to be started, and a daemon started
// from another directory would come up empty (and hand out the job ids of the first again).
std::string DefaultDataDir(const std::string& name);
// DefaultDataDir for a process that is `root` or not, with these $XDG_STATE_HOME and $HOME
// (null: unset; relative ones are ignored, /tmp standing in for a missing home).
std::string DefaultDataDirFor(const std::string& name, bool root, const char* xdg_state_home,
                              const char* home);

// A daemon's exclusive hold on its data directory, for the life of the process (or of this
// object): an flock on <dir>/weft.lock, which holds the holder's pid and program for the error
// of the next one. The kernel drops the lock when the holder dies, however it dies.
class DataDirLock {
 public:
  static constexpr char kFileName[] = "weft.lock";

  // Makes `dir` absolute (against the working directory), creates it and its parents, and
  // locks it for `program`. FAILED_PRECONDITION "--data-dir <abs dir>: in use by <program>
  // (pid N)" when another process (or another DataDirLock) holds it; errors name the flag and
  // the directory.
  static absl::StatusOr<std::unique_ptr<DataDirLock>> Acquire(const std::string& dir,
                                                              const std::string& program);
  ~DataDirLock();  // releases the lock
  DataDirLock(const DataDirLock&) = delete;
  DataDirLock& operator=(const DataDirLock&) = delete;

  // The absolute directory: what the daemon should use and log.
  const std::string& dir() const { return dir_; }

 private:
  DataDirLock(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::string dir_;
  int fd_;
};

struct ServingOptions {
  std::string listen;             // --listen host:port (0: any free port)
  std::string port_file;          // --port-file: the bound gRPC port, written once serving
  std::string metrics_address;    // --metrics-address, or none
  std::string metrics_port_file;  // --metrics-port-file
  // --keepalive-interval-ms, --keepalive-timeout-ms: pings to every client (common/rpc.h).
  KeepaliveOptions keepalive = kDefaultKeepalive;
};

// A daemon's gRPC server and metrics endpoint, started together.
class ServingDaemon {
 public:
  // Starts the metrics endpoint, then a gRPC server with `services` (not owned; they must
  // outlive the daemon) on options.listen with ProcessSecurity()'s credentials, and writes both
  // port files. Plaintext beyond loopback is refused. Both ports are bound exclusively: a port
  // another process serves is UNAVAILABLE naming the flag, the address and why ("Address
  // already in use"), never shared. Errors name the flag that is wrong.
  static absl::StatusOr<std::unique_ptr<ServingDaemon>> Start(
      const ServingOptions& options, std::shared_ptr<prometheus::Registry> registry,
      const std::vector<grpc::Service*>& services);

  int port() const { return port_; }
  // "none" or the metrics port, for logs.
  std::string metrics_port_text() const;
  // Stops accepting calls and cancels those still running after `grace`.
  void Shutdown(absl::Duration grace);

 private:
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace weft

#endif  // WEFT_COMMON_DAEMON_H_
