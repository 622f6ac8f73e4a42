// gRPC helpers shared by daemons, clients and tests: channels, servers, deadlines.
#ifndef WEFT_COMMON_RPC_H_
#define WEFT_COMMON_RPC_H_

#include <chrono>
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
};

// A channel to `target` ("host:port") with the process's security (common/security.h): TLS
// when its flags ask for it, and its bearer token on every call.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelOptions& options = {});

// Applies Weft's server defaults (message size, keepalive) to `builder`.
void ConfigureServerBuilder(grpc::ServerBuilder* builder);

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
