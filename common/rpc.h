// gRPC helpers shared by daemons, clients and tests: channels, servers, deadlines.
#ifndef WEFT_COMMON_RPC_H_
#define WEFT_COMMON_RPC_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "common/security.h"
#include "grpcpp/server_builder.h"

namespace weft {

// Largest message any Weft server or channel accepts (checkpoint chunks are <= 4 MiB).
inline constexpr int kMaxMessageBytes = 16 * 1024 * 1024;

// HTTP/2 keepalive: ping the peer every interval_ms, whether or not a call is in flight, and
// close the connection (failing every call on it) when a ping is not acknowledged within
// timeout_ms. A cut link closes nothing, so without pings a long-lived stream such as a
// worker's session would stay open on a dead connection until TCP gives up, minutes later.
struct KeepaliveOptions {
  int64_t interval_ms = 0;  // 0: no keepalive pings
  int64_t timeout_ms = 1000;
};

// A cut link is then seen within interval + timeout, about 2 s, for a ping of a few dozen
// bytes per connection and second.
inline constexpr KeepaliveOptions kDefaultKeepalive = {.interval_ms = 1000, .timeout_ms = 1000};

struct ChannelOptions {
  // A channel of its own TCP connection instead of one shared with other channels to the same
  // target (simulated workers in one process must not share a connection).
  bool private_connection = false;
  // Ceiling for the reconnect backoff after a lost connection; keeps a restarted coordinator
  // reachable within about this long.
  int max_reconnect_backoff_ms = 1000;
  // Credentials and token to use instead of the process's (ProcessSecurity()); for tests that
  // play several clients.
  const Security* security = nullptr;
  // Off by default: only channels whose loss must be noticed fast (a worker's to the
  // coordinator) ping.
  KeepaliveOptions keepalive;
};

// A channel to `target` ("host:port") with the process's security (common/security.h): TLS
// when its flags ask for it, and its bearer token on every call.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelOptions& options = {});

// Applies Weft's server defaults (message size, exclusive ports) to `builder`, and
// `keepalive`: the server pings its clients with it (so that it sees them behind a cut link),
// and accepts any rate of pings from clients.
void ConfigureServerBuilder(grpc::ServerBuilder* builder,
                            const KeepaliveOptions& keepalive = kDefaultKeepalive);

// Why a listening socket cannot be bound to `address` ("host:port") now, e.g. "Address already
// in use", or empty if it can. For the error of a server that failed to listen: neither gRPC
// nor civetweb says why.
std::string WhyCannotBind(const std::string& address);

// Sets a deadline `timeout` from now on `context`.
inline void SetTimeout(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

// Splits "host:port"; INVALID_ARGUMENT naming `flag` when malformed.
absl::Status CheckHostPort(const std::string& address, const std::string& flag);

// Writes `contents` to `path` through a temporary file and rename, so a reader never sees a
// partial file (tests and scripts poll for port files).
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// Raises the soft open-file limit to the hard limit (thousands of connections).
void RaiseOpenFileLimit();

}  // namespace weft

#endif  // WEFT_COMMON_RPC_H_
