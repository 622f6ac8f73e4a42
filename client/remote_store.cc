#include "client/remote_store.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "client/rpc_call.h"
#include "common/rpc.h"
#include "common/status.h"
#include "grpcpp/client_context.h"

namespace weft {
namespace {

using Stub = weft::v1::Store::Stub;

}  // namespace

RemoteStore::RemoteStore(ServerName server, std::string job_id, int64_t generation,
                         absl::Duration rpc_timeout, absl::Duration reconnect_wait)
    : server_(std::move(server)),
      stub_(weft::v1::Store::NewStub(server_.channel)),
      job_id_(std::move(job_id)),
      generation_(generation),
      rpc_timeout_(rpc_timeout),
      reconnect_(reconnect_wait, rpc_timeout) {}

void RemoteStore::FillScope(weft::v1::StoreScope* scope) const {
  scope->set_job_id(job_id_);
  scope->set_generation(generation_);
}

template <typename Request>
Request RemoteStore::KeyRequest(std::string_view key) const {
  Request request;
  FillScope(request.mutable_scope());
  request.set_key(std::string(key));
  return request;
}

absl::Status RemoteStore::Set(std::string_view key, std::string_view value) {
  auto request = KeyRequest<weft::v1::StoreSetRequest>(key);
  request.set_value(std::string(value));
  return CallUnary(*stub_, &Stub::Set, request, rpc_timeout_, server_, reconnect_.repeated)
      .status();
}

absl::StatusOr<std::string> RemoteStore::Get(std::string_view key) {
  WEFT_ASSIGN_OR_RETURN(weft::v1::StoreGetResponse response,
                        CallUnary(*stub_, &Stub::Get, KeyRequest<weft::v1::StoreGetRequest>(key),
                                  rpc_timeout_, server_, reconnect_.repeated));
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> RemoteStore::Add(std::string_view key, int64_t delta) {
  auto request = KeyRequest<weft::v1::StoreAddRequest>(key);
  request.set_delta(delta);
  WEFT_ASSIGN_OR_RETURN(weft::v1::StoreAddResponse response,
                        CallUnary(*stub_, &Stub::Add, request, rpc_timeout_, server_,
                                  reconnect_.sent_once));
  return response.value();
}

absl::StatusOr<CompareSetResult> RemoteStore::CompareSet(
    std::string_view key, const std::optional<std::string>& expected, std::string_view desired) {
  auto request = KeyRequest<weft::v1::StoreCompareSetRequest>(key);
  // proto3 bytes cannot tell "absent" from "empty", hence the explicit flag.
  if (expected.has_value()) {
    request.set_expected_value(*expected);
  } else {
    request.set_expect_absent(true);
  }
  request.set_desired_value(std::string(desired));
  WEFT_ASSIGN_OR_RETURN(weft::v1::StoreCompareSetResponse response,
                        CallUnary(*stub_, &Stub::CompareSet, request, rpc_timeout_, server_,
                                  reconnect_.sent_once));
  CompareSetResult result;
  result.swapped = response.swapped();
  if (response.exists()) result.value = std::move(*response.mutable_value());
  return result;
}

absl::Status RemoteStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  weft::v1::StoreWaitRequest request;
  FillScope(request.mutable_scope());
  for (const std::string& key : keys) request.add_keys(key);
  // An attempt after a lost connection waits only for what is left of `timeout`.
  const absl::Time deadline = timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + std::max(timeout, absl::ZeroDuration());
  weft::v1::StoreWaitResponse response;
  const grpc::Status status = RunAttempts(
      [&] {
        grpc::ClientContext context;
        if (deadline == absl::InfiniteFuture()) {
          // timeout_ms 0 = until the caller's deadline, and there is none: the server releases
          // the call when the keys appear or the generation ends.
          request.set_timeout_ms(0);
        } else {
          const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
          // 0 would mean "no server-side timeout", the opposite of a zero timeout.
          request.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(left)));
          SetTimeout(&context, left + rpc_timeout_);
        }
        return stub_->Wait(&context, request, &response);
      },
      reconnect_.repeated, server_);
  return status.ok() ? absl::OkStatus() : ConvertNamingServer(status, server_);
}

absl::StatusOr<bool> RemoteStore::Delete(std::string_view key) {
  WEFT_ASSIGN_OR_RETURN(
      weft::v1::StoreDeleteResponse response,
      CallUnary(*stub_, &Stub::Delete, KeyRequest<weft::v1::StoreDeleteRequest>(key), rpc_timeout_,
                server_, reconnect_.sent_once));
  return response.deleted();
}

}  // namespace weft
