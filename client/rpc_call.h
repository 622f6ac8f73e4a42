// How the C++ clients (CoordinatorClient, CheckpointClient, RemoteStore) make a unary call and
// turn its failure into an absl::Status, so that deadlines and error text are decided once.
#ifndef WEFT_CLIENT_RPC_CALL_H_
#define WEFT_CLIENT_RPC_CALL_H_

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

// Runs `attempt` (a callable making one fresh call and returning its grpc::Status). While it
// fails with UNAVAILABLE, waits up to `reconnect_wait` for `server`'s channel to connect and
// runs it again, kCallAttempts in all; a zero `reconnect_wait` runs it once. Only for calls
// that are safe to send again: reads, and writes that replace what an earlier attempt left,
// never one whose second arrival would be refused or counted twice. A connection attempt that
// fails once on a loaded machine, or a server restarted within the wait, then costs the caller
// a delay instead of the operation; a server that stays away fails the call with gRPC's own
// status after one wait.
inline constexpr int kCallAttempts = 3;
template <typename Attempt>
grpc::Status RunAttempts(Attempt&& attempt, absl::Duration reconnect_wait,
                         const ServerName& server) {
  grpc::Status status = attempt();
  if (reconnect_wait <= absl::ZeroDuration() || server.channel == nullptr) return status;
  for (int i = 1; i < kCallAttempts && status.error_code() == grpc::StatusCode::UNAVAILABLE;
       ++i) {
    if (!server.channel->WaitForConnected(std::chrono::system_clock::now() +
                                          absl::ToChronoMilliseconds(reconnect_wait))) {
      break;
    }
    status = attempt();
  }
  return status;
}

// Runs unary call `method` of `stub`, each attempt in a fresh context with deadline `timeout`
// (RunAttempts with `reconnect_wait` decides how many): the response, or the failure converted
// by ConvertNamingServer.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> CallUnary(
    Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, absl::Duration timeout, const ServerName& server,
    absl::Duration reconnect_wait = absl::ZeroDuration()) {
  Response response;
  grpc::Status status = RunAttempts(
      [&] {
        grpc::ClientContext context;
        SetTimeoutUnlessInfinite(&context, timeout);
        response.Clear();
        return (stub.*method)(&context, request, &response);
      },
      reconnect_wait, server);
  if (!status.ok()) return ConvertNamingServer(status, server);
  return response;
}

}  // namespace weft

#endif  // WEFT_CLIENT_RPC_CALL_H_
