#include "coordinator/service.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "coordinator/streams.h"

namespace weft::coordinator {
namespace {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;

// When the coordinator must answer a blocking call (see Coordinator::HoldDeadline).
absl::Time CallDeadline(const Coordinator* coordinator, const CallbackServerContext* context) {
  return coordinator->HoldDeadline(absl::FromChrono(context->deadline()));
}

absl::Status Authorize(const TokenAuthorizer* auth, const CallbackServerContext* context) {
  return auth == nullptr ? absl::OkStatus() : auth->Check(*context);
}

// Finishes a unary call with `status` when the caller is not authorized; true if it did.
bool Reject(const TokenAuthorizer* auth, CallbackServerContext* context,
            ServerUnaryReactor** reactor) {
  absl::Status status = Authorize(auth, context);
  if (status.ok()) return false;
  *reactor = context->DefaultReactor();
  (*reactor)->Finish(ToGrpcStatus(status));
  return true;
}

// A server stream refused before it started (an unauthorized caller).
template <typename T>
class RejectedWriter final : public grpc::ServerWriteReactor<T> {
 public:
  explicit RejectedWriter(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// A completion for an asynchronous operation: copies the result and finishes the call.
template <typename Response>
Coordinator::Done<Response> Finisher(ServerUnaryReactor* reactor, Response* response) {
  return [reactor, response](absl::StatusOr<Response> result) {
    if (result.ok()) *response = std::move(*result);
    reactor->Finish(ToGrpcStatus(result.status()));
  };
}

// A blocking call: `op` parks its completion with the coordinator, which finishes the call.
template <typename Response, typename Op>
ServerUnaryReactor* Parked(const TokenAuthorizer* auth, CallbackServerContext* context,
                           Response* response, Op&& op) {
  ServerUnaryReactor* reactor = nullptr;
  if (Reject(auth, context, &reactor)) return reactor;
  reactor = context->DefaultReactor();
  op(Finisher(reactor, response));
  return reactor;
}

// Runs a synchronous operation and finishes the call with its result.
template <typename Response, typename Op>
ServerUnaryReactor* Unary(const TokenAuthorizer* auth, CallbackServerContext* context,
                          Response* response, Op&& op) {
  return Parked(auth, context, response,
                [&](Coordinator::Done<Response> done) { done(op()); });
}

// A Store call on the key of `request`: runs `op` on the generation's store.
template <typename Request, typename Response, typename Op>
ServerUnaryReactor* OnStore(const TokenAuthorizer* auth, Coordinator* coordinator,
                            CallbackServerContext* context, const Request* request,
                            Response* response, Op&& op) {
  return Unary(auth, context, response, [&]() -> absl::StatusOr<Response> {
    WEFT_ASSIGN_OR_RETURN(auto store, coordinator->StoreForKey(request->scope(), request->key()));
    return op(*store);
  });
}

// A gRPC server stream over one of the coordinator's stream state machines (streams.h): it
// forwards the transport's events and performs the writes the stream asks for.
template <typename Message, typename Stream>
class StreamReactor final : public grpc::ServerWriteReactor<Message>,
                            public StreamOutput<Message> {
 public:
  template <typename... Args>
  explicit StreamReactor(Coordinator* coordinator, Args&&... args)
      : stream_(coordinator, std::forward<Args>(args)..., this) {}
  Stream& stream() { return stream_; }

  void Send(const Message* message) override { this->StartWrite(message); }
  void SendLast(const Message* message, const absl::Status& status) override {
    this->StartWriteAndFinish(message, grpc::WriteOptions(), ToGrpcStatus(status));
  }
  void End(const absl::Status& status) override { this->Finish(ToGrpcStatus(status)); }
  void OnWriteDone(bool ok) override { stream_.OnWriteDone(ok); }
  void OnCancel() override { stream_.OnCancel(); }
  void OnDone() override {
    stream_.OnDone();
    delete this;
  }

 private:
  Stream stream_;
};

}  // namespace

// ---- Coordinator service -------------------------------------------------------------------

ServerUnaryReactor* CoordinatorService::SubmitJob(CallbackServerContext* context,
                                                  const weft::v1::SubmitJobRequest* request,
                                                  weft::v1::SubmitJobResponse* response) {
  return Unary(auth_.get(), context, response, [&] { return coordinator_->SubmitJob(request->spec()); });
}

ServerUnaryReactor* CoordinatorService::GetJob(CallbackServerContext* context,
                                               const weft::v1::GetJobRequest* request,
                                               weft::v1::Job* response) {
  return Unary(auth_.get(), context, response, [&] { return coordinator_->GetJob(request->job_id()); });
}

ServerUnaryReactor* CoordinatorService::ListJobs(CallbackServerContext* context,
                                                 const weft::v1::ListJobsRequest* request,
                                                 weft::v1::ListJobsResponse* response) {
  return Unary(auth_.get(), context, response, [&] { return coordinator_->ListJobs(*request); });
}

ServerUnaryReactor* CoordinatorService::CancelJob(CallbackServerContext* context,
                                                  const weft::v1::CancelJobRequest* request,
                                                  weft::v1::JobStatus* response) {
  return Unary(auth_.get(), context, response,
               [&] { return coordinator_->CancelJob(request->job_id(), request->reason()); });
}

grpc::ServerWriteReactor<weft::v1::JobStatus>* CoordinatorService::WatchJob(
    CallbackServerContext* context, const weft::v1::WatchJobRequest* request) {
  if (absl::Status s = Authorize(auth_.get(), context); !s.ok()) {
    return new RejectedWriter<weft::v1::JobStatus>(s);
  }
  auto* reactor = new StreamReactor<weft::v1::JobStatus, WatchStream>(coordinator_);
  reactor->stream().Start(request->job_id());
  return reactor;
}

ServerUnaryReactor* CoordinatorService::RegisterWorker(
    CallbackServerContext* context, const weft::v1::RegisterWorkerRequest* request,
    weft::v1::RegisterWorkerResponse* response) {
  return Unary(auth_.get(), context, response, [&] {
    return coordinator_->RegisterWorker(request->info(), request->session_token(),
                                        request->has_running() ? &request->running() : nullptr);
  });
}

ServerUnaryReactor* CoordinatorService::Heartbeat(CallbackServerContext* context,
                                                  const weft::v1::HeartbeatRequest* request,
                                                  weft::v1::HeartbeatResponse* response) {
  return Parked(auth_.get(), context, response, [&](auto done) {
    coordinator_->Heartbeat(*request, CallDeadline(coordinator_, context), std::move(done));
  });
}

grpc::ServerWriteReactor<weft::v1::SessionEvent>* CoordinatorService::OpenSession(
    CallbackServerContext* context, const weft::v1::OpenSessionRequest* request) {
  if (absl::Status s = Authorize(auth_.get(), context); !s.ok()) {
    return new RejectedWriter<weft::v1::SessionEvent>(s);
  }
  auto* reactor = new StreamReactor<weft::v1::SessionEvent, SessionStream>(
      coordinator_, request->session_token());
  reactor->stream().Start();
  return reactor;
}

ServerUnaryReactor* CoordinatorService::ListWorkers(CallbackServerContext* context,
                                                    const weft::v1::ListWorkersRequest* request,
                                                    weft::v1::ListWorkersResponse* response) {
  return Unary(auth_.get(), context, response, [&] { return coordinator_->ListWorkers(); });
}

ServerUnaryReactor* CoordinatorService::Join(CallbackServerContext* context,
                                             const weft::v1::JoinRequest* request,
                                             weft::v1::JoinResponse* response) {
  return Parked(auth_.get(), context, response, [&](auto done) {
    coordinator_->Join(*request, CallDeadline(coordinator_, context), std::move(done));
  });
}

ServerUnaryReactor* CoordinatorService::ReportProgress(
    CallbackServerContext* context, const weft::v1::ReportProgressRequest* request,
    weft::v1::ReportProgressResponse* response) {
  return Unary(auth_.get(), context, response, [&] { return coordinator_->ReportProgress(*request); });
}

ServerUnaryReactor* CoordinatorService::GetJobLogs(CallbackServerContext* context,
                                                   const weft::v1::GetJobLogsRequest* request,
                                                   weft::v1::GetJobLogsResponse* response) {
  return Unary(auth_.get(), context, response, [&] { return coordinator_->GetJobLogs(*request); });
}

// ---- Store service -------------------------------------------------------------------------

ServerUnaryReactor* StoreService::Set(CallbackServerContext* context,
                                      const weft::v1::StoreSetRequest* request,
                                      weft::v1::StoreSetResponse* response) {
  return OnStore(auth_.get(), coordinator_, context, request, response,
                 [&](MemoryStore& store) -> absl::StatusOr<weft::v1::StoreSetResponse> {
                   WEFT_RETURN_IF_ERROR(store.Set(request->key(), request->value()));
                   return weft::v1::StoreSetResponse();
                 });
}

ServerUnaryReactor* StoreService::Get(CallbackServerContext* context,
                                      const weft::v1::StoreGetRequest* request,
                                      weft::v1::StoreGetResponse* response) {
  return OnStore(auth_.get(), coordinator_, context, request, response,
                 [&](MemoryStore& store) -> absl::StatusOr<weft::v1::StoreGetResponse> {
                   weft::v1::StoreGetResponse r;
                   WEFT_ASSIGN_OR_RETURN(*r.mutable_value(), store.Get(request->key()));
                   return r;
                 });
}

ServerUnaryReactor* StoreService::Add(CallbackServerContext* context,
                                      const weft::v1::StoreAddRequest* request,
                                      weft::v1::StoreAddResponse* response) {
  return OnStore(auth_.get(), coordinator_, context, request, response,
                 [&](MemoryStore& store) -> absl::StatusOr<weft::v1::StoreAddResponse> {
                   WEFT_ASSIGN_OR_RETURN(int64_t value, store.Add(request->key(), request->delta()));
                   weft::v1::StoreAddResponse r;
                   r.set_value(value);
                   return r;
                 });
}

ServerUnaryReactor* StoreService::CompareSet(CallbackServerContext* context,
                                             const weft::v1::StoreCompareSetRequest* request,
                                             weft::v1::StoreCompareSetResponse* response) {
  return OnStore(
      auth_.get(), coordinator_, context, request, response,
      [&](MemoryStore& store) -> absl::StatusOr<weft::v1::StoreCompareSetResponse> {
        std::optional<std::string> expected;
        if (!request->expect_absent()) expected = request->expected_value();
        WEFT_ASSIGN_OR_RETURN(CompareSetResult result,
                              store.CompareSet(request->key(), expected, request->desired_value()));
        weft::v1::StoreCompareSetResponse r;
        r.set_swapped(result.swapped);
        r.set_exists(result.value.has_value());
        if (result.value) r.set_value(*result.value);
        return r;
      });
}

ServerUnaryReactor* StoreService::Wait(CallbackServerContext* context,
                                       const weft::v1::StoreWaitRequest* request,
                                       weft::v1::StoreWaitResponse* response) {
  return Parked(auth_.get(), context, response, [&](auto done) {
    coordinator_->WaitForKeys(request->scope(),
                              std::vector<std::string>(request->keys().begin(),
                                                       request->keys().end()),
                              request->timeout_ms(), CallDeadline(coordinator_, context),
                              std::move(done));
  });
}

ServerUnaryReactor* StoreService::Delete(CallbackServerContext* context,
                                         const weft::v1::StoreDeleteRequest* request,
                                         weft::v1::StoreDeleteResponse* response) {
  return OnStore(auth_.get(), coordinator_, context, request, response,
                 [&](MemoryStore& store) -> absl::StatusOr<weft::v1::StoreDeleteResponse> {
                   WEFT_ASSIGN_OR_RETURN(bool deleted, store.Delete(request->key()));
                   weft::v1::StoreDeleteResponse r;
                   r.set_deleted(deleted);
                   return r;
                 });
}

}  // namespace weft::coordinator
