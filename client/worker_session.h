// Keeps a worker process's session with the coordinator (Coordinator.OpenSession) open on a
// background thread, reopening it with backoff whenever it ends, for as long as the process
// lives. Start it, wait for it to open, then register with its token(). The session is what lets the coordinator tell a worker that exited (killed, crashed)
// from one that is only slow: the kernel closes the dead process's connection, the
// transport cancels the stream, and the worker is declared dead within the coordinator's
// connection-lost grace instead of its heartbeat timeout. Unlike a held heartbeat, which is
// absent between two calls, the session is open at every moment the worker is alive and
// connected — from before registration on — so no instant of death escapes it.
//
// Thread-safe.
#ifndef WEFT_CLIENT_WORKER_SESSION_H_
#define WEFT_CLIENT_WORKER_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "weft/v1/coordinator.grpc.pb.h"

namespace weft {

struct WorkerSessionOptions {
  // Wait before reopening a session that failed; doubles up to max_backoff. A session that
  // was open and ended is reopened at once.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(1);
};

class WorkerSession {
 public:
  explicit WorkerSession(std::shared_ptr<grpc::Channel> channel,
                         WorkerSessionOptions options = {});
  ~WorkerSession();  // Stop()
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  // Starts the background thread. Idempotent.
  void Start();
  // Waits until a session is open, at most `timeout`; false if none is (the coordinator is
  // unreachable, or too old to know sessions: register anyway, without the fast detection).
  bool WaitOpen(absl::Duration timeout);
  // Closes the session and joins the thread. Idempotent.
  void Stop();

  // Random, fixed for this object's life: pass it to RegisterWorker.
  const std::string& token() const { return token_; }
  // Sessions the coordinator confirmed so far (for tests and logs).
  int64_t sessions_opened() const;

 private:
  void Loop();

  std::unique_ptr<weft::v1::Coordinator::Stub> stub_;
  const WorkerSessionOptions options_;
  const std::string token_;
  mutable absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t sessions_opened_ ABSL_GUARDED_BY(mu_) = 0;
  // The open call's context, to cancel it from Stop.
  grpc::ClientContext* open_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace weft

#endif  // WEFT_CLIENT_WORKER_SESSION_H_
