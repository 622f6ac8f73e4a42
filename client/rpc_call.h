// How the C++ clients (CoordinatorClient, CheckpointClient, RemoteStore) make a unary call and
// turn its failure into an absl::Status, so that deadlines and error text are decided once.
#ifndef WEFT_CLIENT_RPC_CALL_H_
#define WEFT_CLIENT_RPC_CALL_H_

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace weft {

// Sets `timeout` as the deadline of `context`; an infinite timeout sets none (now + infinity
// would overflow the clock).
inline void SetTimeoutUnlessInfinite(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  SetTimeout(context, timeout);
}

// The server a client talks to, as its failures should name it.
struct ServerName {
  // The client's channel; null: failures are converted unchanged.
  std::shared_ptr<grpc::Channel> channel;
  // "coordinator 10.0.0.1:7070", "checkpointd 10.0.0.2:7071".
  std::string who;
};

// FromGrpcStatus, plus "<who> unreachable: " in front when the failure is that nothing
// answered (UNAVAILABLE or DEADLINE_EXCEEDED while the channel is not connected): gRPC's own
// text does not tell a user which address flag was wrong. A READY channel means the server
// itself answered with that code (a Join that timed out, a refusal), and its message is kept.
absl::Status ConvertNamingServer(const grpc::Status& status, const ServerName& server);

// How a call meets a server it cannot reach at the moment.
struct Reconnect {
  // How long the call waits for its channel to connect before it is sent; zero: sent at
  // once, failing fast (UNAVAILABLE) while the channel is not connected.
  absl::Duration wait = absl::ZeroDuration();
  // Whether a call that failed with UNAVAILABLE goes again (after another wait), kCallAttempts
  // in all. Only for calls that are safe to send twice: reads, and writes that replace what an
  // earlier attempt left; never one whose second arrival would be refused or counted twice
  // (those get only the wait before they are sent).
  bool repeat = false;
};
inline constexpr int kCallAttempts = 3;

// A client's two Reconnects from its one wait (capped at its call timeout, so that a wait never
// outlasts the call it precedes): `repeated` for calls safe to send twice, `sent_once` for the
// rest.
struct ReconnectPolicies {
  ReconnectPolicies(absl::Duration reconnect_wait, absl::Duration rpc_timeout)
      : repeated{.wait = std::min(reconnect_wait, rpc_timeout), .repeat = true},
        sent_once{.wait = std::min(reconnect_wait, rpc_timeout), .repeat = false} {}
  Reconnect repeated;
  Reconnect sent_once;
};

// Runs `attempt` (a callable making one fresh call and returning its grpc::Status) as
// `reconnect` says, on `server`'s channel. A connection attempt that fails once on a loaded
// machine, or a server restarted within the wait, then costs the caller a delay instead of
// the operation; a server that stays away fails the call with gRPC's own status after one
// wait.
template <typename Attempt>
grpc::Status RunAttempts(Attempt&& attempt, const Reconnect& reconnect, const ServerName& server) {
  if (reconnect.wait <= absl::ZeroDuration() || server.channel == nullptr) return attempt();
  // Returns at once on a connected channel; otherwise starts connecting and waits.
  const auto connected = [&] {
    return server.channel->WaitForConnected(std::chrono::system_clock::now() +
                                            absl::ToChronoMilliseconds(reconnect.wait));
  };
  // Sent even when the wait ran out, so that the failure carries gRPC's reason.
  bool reachable = connected();
  grpc::Status status = attempt();
  for (int i = 1; reconnect.repeat && reachable && i < kCallAttempts &&
                  status.error_code() == grpc::StatusCode::UNAVAILABLE;
       ++i) {
    reachable = connected();
    if (reachable) status = attempt();
  }
  return status;
}

// Runs unary call `method` of `stub`, each attempt in a fresh context with deadline `timeout`
// (RunAttempts with `reconnect` decides when and how often): the response, or the failure
// converted by ConvertNamingServer.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> CallUnary(
    Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, absl::Duration timeout, const ServerName& server,
    const Reconnect& reconnect = {}) {
  Response response;
  grpc::Status status = RunAttempts(
      [&] {
        grpc::ClientContext context;
        SetTimeoutUnlessInfinite(&context, timeout);
        response.Clear();
        return (stub.*method)(&context, request, &response);
      },
      reconnect, server);
  if (!status.ok()) return ConvertNamingServer(status, server);
  return response;
}

}  // namespace weft

#endif  // WEFT_CLIENT_RPC_CALL_H_
