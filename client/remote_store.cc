#include "client/remote_store.h"

#include <algorithm>
#include <utility>

#include "common/rpc.h"
#include "common/status.h"
#include "grpcpp/client_context.h"

namespace weft {

RemoteStore::RemoteStore(std::shared_ptr<grpc::Channel> channel, std::string job_id,
                         int64_t generation, absl::Duration rpc_timeout)
    : channel_(std::move(channel)),
      stub_(weft::v1::Store::NewStub(channel_)),
      job_id_(std::move(job_id)),
      generation_(generation),
      rpc_timeout_(rpc_timeout) {}

void RemoteStore::FillScope(weft::v1::StoreScope* scope) const {
  scope->set_job_id(job_id_);
  scope->set_generation(generation_);
}

absl::Status RemoteStore::Set(std::string_view key, std::string_view value) {
  weft::v1::StoreSetRequest request;
  FillScope(request.mutable_scope());
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  weft::v1::StoreSetResponse response;
  grpc::ClientContext context;
  SetTimeout(&context, rpc_timeout_);
  return FromGrpcStatus(stub_->Set(&context, request, &response));
}

absl::StatusOr<std::string> RemoteStore::Get(std::string_view key) {
  weft::v1::StoreGetRequest request;
  FillScope(request.mutable_scope());
  request.set_key(std::string(key));
  weft::v1::StoreGetResponse response;
  grpc::ClientContext context;
  SetTimeout(&context, rpc_timeout_);
  WEFT_RETURN_IF_ERROR(FromGrpcStatus(stub_->Get(&context, request, &response)));
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> RemoteStore::Add(std::string_view key, int64_t delta) {
  weft::v1::StoreAddRequest request;
  FillScope(request.mutable_scope());
  request.set_key(std::string(key));
  request.set_delta(delta);
  weft::v1::StoreAddResponse response;
  grpc::ClientContext context;
  SetTimeout(&context, rpc_timeout_);
  WEFT_RETURN_IF_ERROR(FromGrpcStatus(stub_->Add(&context, request, &response)));
  return response.value();
}

absl::StatusOr<CompareSetResult> RemoteStore::CompareSet(
    std::string_view key, const std::optional<std::string>& expected, std::string_view desired) {
  weft::v1::StoreCompareSetRequest request;
  FillScope(request.mutable_scope());
  request.set_key(std::string(key));
  // proto3 bytes cannot tell "absent" from "empty", hence the explicit flag.
  if (expected.has_value()) {
    request.set_expected_value(*expected);
  } else {
    request.set_expect_absent(true);
  }
  request.set_desired_value(std::string(desired));
  weft::v1::StoreCompareSetResponse response;
  grpc::ClientContext context;
  SetTimeout(&context, rpc_timeout_);
  WEFT_RETURN_IF_ERROR(FromGrpcStatus(stub_->CompareSet(&context, request, &response)));
  CompareSetResult result;
  result.swapped = response.swapped();
  if (response.exists()) result.value = std::move(*response.mutable_value());
  return result;
}

absl::Status RemoteStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  weft::v1::StoreWaitRequest request;
  FillScope(request.mutable_scope());
  for (const std::string& key : keys) request.add_keys(key);
  grpc::ClientContext context;
  if (timeout == absl::InfiniteDuration()) {
    // timeout_ms 0 = until the caller's deadline, and there is none: the server releases
    // the call when the keys appear or the generation ends.
    request.set_timeout_ms(0);
  } else {
    // 0 would mean "no server-side timeout", the opposite of a zero timeout.
    request.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
    SetTimeout(&context, std::max(timeout, absl::ZeroDuration()) + rpc_timeout_);
  }
  weft::v1::StoreWaitResponse response;
  return FromGrpcStatus(stub_->Wait(&context, request, &response));
}

absl::StatusOr<bool> RemoteStore::Delete(std::string_view key) {
  weft::v1::StoreDeleteRequest request;
  FillScope(request.mutable_scope());
  request.set_key(std::string(key));
  weft::v1::StoreDeleteResponse response;
  grpc::ClientContext context;
  SetTimeout(&context, rpc_timeout_);
  WEFT_RETURN_IF_ERROR(FromGrpcStatus(stub_->Delete(&context, request, &response)));
  return response.deleted();
}

}  // namespace weft
