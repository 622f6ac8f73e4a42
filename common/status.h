// Status plumbing shared by every component.
//
// absl::Status / absl::StatusOr cross every boundary inside Weft; gRPC statuses exist only at
// the RPC edge. The two use the same canonical code numbers, so conversion is lossless.
#ifndef WEFT_COMMON_STATUS_H_
#define WEFT_COMMON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"

#define WEFT_STATUS_CONCAT_INNER_(a, b) a##b
#define WEFT_STATUS_CONCAT_(a, b) WEFT_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define WEFT_RETURN_IF_ERROR(expr)                                 \
  do {                                                             \
    ::absl::Status weft_status_ = (expr);                          \
    if (!weft_status_.ok()) return weft_status_;                   \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or return its status if not OK.
// `lhs` may be a declaration: WEFT_ASSIGN_OR_RETURN(auto x, Foo());
#define WEFT_ASSIGN_OR_RETURN(lhs, rexpr) \
  WEFT_ASSIGN_OR_RETURN_IMPL_(WEFT_STATUS_CONCAT_(weft_statusor_, __LINE__), lhs, rexpr)
#define WEFT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace weft {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace weft

#endif  // WEFT_COMMON_STATUS_H_
