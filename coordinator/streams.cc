#include "coordinator/streams.h"

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace weft::coordinator {

// ---- SessionStream -------------------------------------------------------------------------

struct SessionStream::Sink {
  absl::Mutex mu;
  StreamOutput<weft::v1::SessionEvent>* output ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t session_id ABSL_GUARDED_BY(mu) = 0;
  bool writing ABSL_GUARDED_BY(mu) = false;
  bool finish_called ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  std::optional<absl::Status> deferred ABSL_GUARDED_BY(mu);

  // Finishes the stream once, after the confirmation's write if one is in flight.
  void End(const absl::Status& status) {
    StreamOutput<weft::v1::SessionEvent>* finish = nullptr;
    {
      absl::MutexLock lock(&mu);
      if (output == nullptr || finish_called) return;
      if (writing) {
        deferred = status;
        return;
      }
      finish_called = true;
      finish = output;
    }
    // OnDone (which clears `output`) cannot run before this End.
    finish->End(status);
  }
};

SessionStream::SessionStream(Coordinator* coordinator, std::string token,
                             StreamOutput<weft::v1::SessionEvent>* output)
    : coordinator_(coordinator), token_(std::move(token)), sink_(std::make_shared<Sink>()) {
  absl::MutexLock lock(&sink_->mu);
  sink_->output = output;
}

void SessionStream::Start() {
  auto id = coordinator_->OpenSession(token_, [sink = sink_](absl::Status s) { sink->End(s); });
  if (!id.ok()) {
    sink_->End(id.status());
    return;
  }
  bool cancelled = false;
  bool write = false;
  StreamOutput<weft::v1::SessionEvent>* output = nullptr;
  {
    absl::MutexLock lock(&sink_->mu);
    sink_->session_id = *id;
    cancelled = sink_->cancelled;
    write = sink_->writing = !cancelled && !sink_->finish_called;
    output = sink_->output;
  }
  // Cancelled before the session was recorded: OnCancel could not report it.
  if (cancelled) coordinator_->SessionClosed(token_, *id);
  if (!write) return;  // cancelled, or already replaced and finished
  event_.set_session_id(*id);
  output->Send(&event_);
}

void SessionStream::OnWriteDone(bool /*ok*/) {
  // Nothing more is sent; a failed write is followed by OnCancel.
  std::optional<absl::Status> finish;
  StreamOutput<weft::v1::SessionEvent>* output = nullptr;
  {
    absl::MutexLock lock(&sink_->mu);
    sink_->writing = false;
    if (sink_->deferred && !sink_->finish_called) {
      sink_->finish_called = true;
      finish = *sink_->deferred;
      output = sink_->output;
    }
  }
  if (finish) output->End(*finish);
}

void SessionStream::OnCancel() {
  uint64_t id = 0;
  {
    absl::MutexLock lock(&sink_->mu);
    sink_->cancelled = true;
    id = sink_->session_id;
  }
  if (id != 0) coordinator_->SessionClosed(token_, id);
  sink_->End(absl::CancelledError("session cancelled"));
}

void SessionStream::OnDone() {
  absl::MutexLock lock(&sink_->mu);
  sink_->output = nullptr;
}

// ---- WatchStream ---------------------------------------------------------------------------

// What the coordinator's watcher callback and the stream share. The callback may run on any
// thread at any time, also while the stream is being destroyed, so it reaches only the sink
// (shared) and never the WatchStream; OnDone clears `output`, after which nothing is written.
struct WatchStream::Sink {
  absl::Mutex mu;
  StreamOutput<weft::v1::JobStatus>* output ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t watcher_id ABSL_GUARDED_BY(mu) = 0;
  uint64_t last_seq ABSL_GUARDED_BY(mu) = 0;
  std::optional<weft::v1::JobStatus> pending ABSL_GUARDED_BY(mu);
  bool pending_final ABSL_GUARDED_BY(mu) = false;
  bool writing ABSL_GUARDED_BY(mu) = false;
  bool finish_called ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  // The message being written: set by the one writer (`writing` true), read by gRPC until
  // OnWriteDone.
  weft::v1::JobStatus in_flight;

  // Records a snapshot; true if the caller must start a write.
  bool Acquire(const weft::v1::JobStatus& status, uint64_t seq, bool final) {
    absl::MutexLock lock(&mu);
    if (output == nullptr || finish_called || seq <= last_seq) return false;
    last_seq = seq;
    pending = status;
    pending_final = final;
    return !writing;
  }
};

WatchStream::WatchStream(Coordinator* coordinator, StreamOutput<weft::v1::JobStatus>* output)
    : coordinator_(coordinator), sink_(std::make_shared<Sink>()) {
  absl::MutexLock lock(&sink_->mu);
  sink_->output = output;
}

void WatchStream::Start(const std::string& job_id) {
  auto id = coordinator_->AddWatcher(
      job_id, [sink = sink_](const weft::v1::JobStatus& status, uint64_t seq, bool final) {
        if (sink->Acquire(status, seq, final)) WriteNext(sink);
      });
  if (!id.ok()) {
    StreamOutput<weft::v1::JobStatus>* finish = nullptr;
    {
      absl::MutexLock lock(&sink_->mu);
      if (!sink_->writing && !sink_->finish_called) {
        sink_->finish_called = true;
        finish = sink_->output;
      }
    }
    if (finish) finish->End(id.status());
    return;
  }
  absl::MutexLock lock(&sink_->mu);
  sink_->watcher_id = *id;
}

void WatchStream::OnWriteDone(bool ok) {
  StreamOutput<weft::v1::JobStatus>* finish = nullptr;
  {
    absl::MutexLock lock(&sink_->mu);
    sink_->writing = false;
    if (sink_->finish_called) return;  // that write carried the finish
    if (!ok || sink_->cancelled) {
      sink_->finish_called = true;
      finish = sink_->output;
    } else if (!sink_->pending) {
      return;
    }
  }
  if (finish) {
    finish->End(absl::CancelledError("watch cancelled"));
  } else {
    WriteNext(sink_);
  }
}

void WatchStream::OnCancel() {
  StreamOutput<weft::v1::JobStatus>* finish = nullptr;
  {
    absl::MutexLock lock(&sink_->mu);
    sink_->cancelled = true;
    if (!sink_->writing && !sink_->finish_called) {
      sink_->finish_called = true;
      finish = sink_->output;
    }
  }
  if (finish) finish->End(absl::CancelledError("watch cancelled"));
}

void WatchStream::OnDone() {
  uint64_t id = 0;
  {
    absl::MutexLock lock(&sink_->mu);
    sink_->output = nullptr;
    id = sink_->watcher_id;
  }
  if (id != 0) coordinator_->RemoveWatcher(id);
}

void WatchStream::WriteNext(const std::shared_ptr<Sink>& sink) {
  bool final = false;
  StreamOutput<weft::v1::JobStatus>* output = nullptr;
  {
    absl::MutexLock lock(&sink->mu);
    if (sink->output == nullptr || sink->writing || sink->finish_called || !sink->pending) {
      return;
    }
    sink->in_flight = std::move(*sink->pending);
    sink->pending.reset();
    sink->writing = true;
    final = sink->pending_final;
    if (final) sink->finish_called = true;
    output = sink->output;
  }
  if (!final) {
    output->Send(&sink->in_flight);
    return;
  }
  output->SendLast(&sink->in_flight, JobHasEnded(sink->in_flight.state())
                                    ? absl::OkStatus()
                                    : absl::UnavailableError(
                                          "coordinator shutting down; watch again"));
}

}  // namespace weft::coordinator
