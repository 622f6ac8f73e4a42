// How the C++ clients (CoordinatorClient, CheckpointClient, RemoteStore) make a unary call and
// turn its failure into an absl::Status, so that deadlines and error text are decided once.
#ifndef WEFT_CLIENT_RPC_CALL_H_
#define WEFT_CLIENT_RPC_CALL_H_

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

// Runs one unary call `method` of `stub` in a fresh context with deadline `timeout`: the
// response, or the failure converted by ConvertNamingServer.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> CallUnary(
    Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, absl::Duration timeout, const ServerName& server) {
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, timeout);
  Response response;
  grpc::Status status = (stub.*method)(&context, request, &response);
  if (!status.ok()) return ConvertNamingServer(status, server);
  return response;
}

}  // namespace weft

#endif  // WEFT_CLIENT_RPC_CALL_H_
