#include "coordinator/service.h"

#include <atomic>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

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

// Runs a synchronous operation and finishes the call with its result.
template <typename Response, typename Op>
ServerUnaryReactor* Unary(const TokenAuthorizer* auth, CallbackServerContext* context,
                          Response* response, Op&& op) {
  ServerUnaryReactor* reactor = nullptr;
  if (Reject(auth, context, &reactor)) return reactor;
  reactor = context->DefaultReactor();
  absl::StatusOr<Response> result = op();
  if (result.ok()) *response = std::move(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

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

// One worker session (Coordinator.OpenSession): writes the confirmation, then stays open until
// the transport cancels it — the worker's process exited or its connection broke, which
// SessionClosed reports — or the coordinator ends it. State shared with the coordinator's
// SessionEnd lives in Sink, which outlives the reactor.
class SessionReactor final : public grpc::ServerWriteReactor<weft::v1::SessionEvent> {
 public:
  SessionReactor(Coordinator* coordinator, const weft::v1::OpenSessionRequest& request)
      : coordinator_(coordinator), token_(request.session_token()), sink_(std::make_shared<Sink>()) {
    sink_->reactor = this;
  }

  void Start() {
    auto id = coordinator_->OpenSession(token_, [sink = sink_](absl::Status s) { sink->End(s); });
    if (!id.ok()) {
      sink_->End(id.status());
      return;
    }
    bool cancelled = false;
    bool write = false;
    {
      absl::MutexLock lock(&sink_->mu);
      session_id_ = *id;
      cancelled = sink_->cancelled;
      write = sink_->writing = !cancelled && !sink_->finish_called;
    }
    // Cancelled before the session was recorded: OnCancel could not report it.
    if (cancelled) coordinator_->SessionClosed(token_, *id);
    if (!write) return;  // cancelled, or already replaced and finished
    event_.set_session_id(*id);
    StartWrite(&event_);
  }

  void OnWriteDone(bool /*ok*/) override {
    // Nothing more is sent; a failed write is followed by OnCancel.
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&sink_->mu);
      sink_->writing = false;
      if (sink_->deferred && !sink_->finish_called) {
        sink_->finish_called = true;
        finish = *sink_->deferred;
      }
    }
    if (finish) Finish(*finish);
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&sink_->mu);
      sink_->cancelled = true;
      id = session_id_;
    }
    if (id != 0) coordinator_->SessionClosed(token_, id);
    sink_->End(absl::CancelledError("session cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&sink_->mu);
      sink_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct Sink {
    absl::Mutex mu;
    SessionReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool finish_called ABSL_GUARDED_BY(mu) = false;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    std::optional<grpc::Status> deferred ABSL_GUARDED_BY(mu);

    // Finishes the stream once, after the confirmation's write if one is in flight.
    void End(const absl::Status& status) {
      SessionReactor* finish = nullptr;
      {
        absl::MutexLock lock(&mu);
        if (reactor == nullptr || finish_called) return;
        if (writing) {
          deferred = ToGrpcStatus(status);
          return;
        }
        finish_called = true;
        finish = reactor;
      }
      // OnDone (which clears `reactor`) cannot run before this Finish.
      finish->Finish(ToGrpcStatus(status));
    }
  };

  Coordinator* coordinator_;
  const std::string token_;
  std::shared_ptr<Sink> sink_;
  uint64_t session_id_ ABSL_GUARDED_BY(sink_->mu) = 0;
  weft::v1::SessionEvent event_;
};

// Streams job status snapshots to one WatchJob caller. Snapshots arriving while a write is in
// flight are coalesced (the newest wins: each carries the full status). gRPC operations are
// started outside mu_, because gRPC may run the resulting reaction on the calling thread.
class WatchReactor final : public grpc::ServerWriteReactor<weft::v1::JobStatus> {
 public:
  explicit WatchReactor(Coordinator* coordinator) : coordinator_(coordinator) {}

  void Start(const std::string& job_id) {
    auto id = coordinator_->AddWatcher(
        job_id, [self = sink_](const weft::v1::JobStatus& status, uint64_t seq, bool final) {
          if (auto* reactor = self->Acquire(status, seq, final)) reactor->WriteNext();
        });
    if (!id.ok()) {
      bool finish = false;
      {
        absl::MutexLock lock(&sink_->mu);
        if (!sink_->writing && !sink_->finish_called) finish = sink_->finish_called = true;
        sink_->deferred_status = ToGrpcStatus(id.status());
      }
      if (finish) Finish(ToGrpcStatus(id.status()));
      return;
    }
    absl::MutexLock lock(&sink_->mu);
    watcher_id_ = *id;
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&sink_->mu);
      sink_->writing = false;
      if (sink_->finish_called) return;  // that write carried the finish
      if (!ok || sink_->cancelled) {
        sink_->finish_called = finish = true;
        status = grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled");
      } else if (!sink_->pending) {
        return;
      }
    }
    if (finish) {
      Finish(status);
    } else {
      WriteNext();
    }
  }

  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&sink_->mu);
      sink_->cancelled = true;
      if (!sink_->writing && !sink_->finish_called) finish = sink_->finish_called = true;
    }
    if (finish) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&sink_->mu);
      sink_->reactor = nullptr;
    }
    uint64_t id = 0;
    {
      absl::MutexLock lock(&sink_->mu);
      id = watcher_id_;
    }
    if (id != 0) coordinator_->RemoveWatcher(id);
    delete this;
  }

 private:
  struct Sink {
    absl::Mutex mu;
    WatchReactor* reactor = nullptr;
    uint64_t last_seq = 0;
    std::optional<weft::v1::JobStatus> pending;
    bool pending_final = false;
    bool writing = false;
    bool finish_called = false;
    bool cancelled = false;
    grpc::Status deferred_status;

    // Records a snapshot; returns the reactor if the caller must start a write.
    WatchReactor* Acquire(const weft::v1::JobStatus& status, uint64_t seq, bool final) {
      absl::MutexLock lock(&mu);
      if (reactor == nullptr || finish_called || seq <= last_seq) return nullptr;
      last_seq = seq;
      pending = status;
      pending_final = final;
      return writing ? nullptr : reactor;
    }
  };

  // Starts a write of the pending snapshot, if any and none is in flight.
  void WriteNext() {
    bool final = false;
    {
      absl::MutexLock lock(&sink_->mu);
      if (sink_->writing || sink_->finish_called || !sink_->pending) return;
      in_flight_ = std::move(*sink_->pending);
      sink_->pending.reset();
      sink_->writing = true;
      final = sink_->pending_final;
      if (final) sink_->finish_called = true;
    }
    if (!final) {
      StartWrite(&in_flight_);
      return;
    }
    const auto state = in_flight_.state();
    const bool ended = state == weft::v1::SUCCEEDED || state == weft::v1::FAILED ||
                       state == weft::v1::CANCELLED;
    StartWriteAndFinish(&in_flight_, grpc::WriteOptions(),
                        ended ? grpc::Status::OK
                              : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                             "coordinator shutting down; watch again"));
  }

  Coordinator* coordinator_;
  std::shared_ptr<Sink> sink_ = [this] {
    auto s = std::make_shared<Sink>();
    s->reactor = this;
    return s;
  }();
  uint64_t watcher_id_ = 0;  // guarded by sink_->mu
  weft::v1::JobStatus in_flight_;
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
  auto* reactor = new WatchReactor(coordinator_);
  reactor->Start(request->job_id());
  return reactor;
}

ServerUnaryReactor* CoordinatorService::RegisterWorker(
    CallbackServerContext* context, const weft::v1::RegisterWorkerRequest* request,
    weft::v1::RegisterWorkerResponse* response) {
  return Unary(auth_.get(), context, response, [&] {
    return coordinator_->RegisterWorker(request->info(), request->session_token());
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
  auto* reactor = new SessionReactor(coordinator_, *request);
  reactor->Start();
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
