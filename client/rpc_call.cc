#include "client/rpc_call.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/status_context.h"

namespace weft {

absl::Status ConvertNamingServer(const grpc::Status& status, const ServerName& server) {
  absl::Status converted = FromGrpcStatus(status);
  const bool connection_failure = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                  status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (!connection_failure || server.channel == nullptr ||
      server.channel->GetState(false) == GRPC_CHANNEL_READY) {
    return converted;
  }
  return Annotate(converted, absl::StrCat(server.who, " unreachable"));
}

}  // namespace weft
