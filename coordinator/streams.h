// The coordinator's two server streams as state machines independent of the transport: a
// worker's session (Coordinator.OpenSession) and a job watch (Coordinator.WatchJob). The gRPC
// reactor in service.cc only forwards its events here and performs the writes asked of it.
//
// Both follow the same rules: a stream is finished exactly once; nothing is written while a
// write is in flight; and transport operations are started with no stream lock held, because
// the transport may run the resulting reaction on the calling thread. State shared with the
// coordinator's callbacks lives in a Sink that outlives the stream.
#ifndef WEFT_COORDINATOR_STREAMS_H_
#define WEFT_COORDINATOR_STREAMS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "coordinator/coordinator.h"
#include "weft/v1/coordinator.pb.h"

namespace weft::coordinator {

// What a stream asks of its transport. `message` stays valid until the write completes.
template <typename Message>
class StreamOutput {
 public:
  virtual ~StreamOutput() = default;
  virtual void Send(const Message* message) = 0;
  virtual void SendLast(const Message* message, const absl::Status& status) = 0;
  virtual void End(const absl::Status& status) = 0;
};

// One worker session: confirms the session with its id, then stays open until the transport
// cancels it — the worker's process exited or its connection broke, which it reports through
// Coordinator::SessionClosed — or the coordinator ends it (a newer session, shutdown).
class SessionStream {
 public:
  SessionStream(Coordinator* coordinator, std::string token,
                StreamOutput<weft::v1::SessionEvent>* output);
  void Start();
  void OnWriteDone(bool ok);
  void OnCancel();
  // The transport is done with the stream; nothing reaches `output` after this.
  void OnDone();

 private:
  struct Sink;
  Coordinator* coordinator_;
  const std::string token_;
  std::shared_ptr<Sink> sink_;
  weft::v1::SessionEvent event_;
};

// One WatchJob caller: the job's status at once, then after every change until the job ends.
// Snapshots arriving while a write is in flight are coalesced (the newest wins: each carries
// the full status).
class WatchStream {
 public:
  WatchStream(Coordinator* coordinator, StreamOutput<weft::v1::JobStatus>* output);
  void Start(const std::string& job_id);
  void OnWriteDone(bool ok);
  void OnCancel();
  // The transport is done with the stream; the watcher is removed.
  void OnDone();

 private:
  struct Sink;
  // Starts a write of the sink's pending snapshot, if any, none is in flight and the stream
  // is not done. Static: the watcher callback calls it with only the sink, which outlives the
  // stream.
  static void WriteNext(const std::shared_ptr<Sink>& sink);

  Coordinator* coordinator_;
  std::shared_ptr<Sink> sink_;
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_STREAMS_H_
