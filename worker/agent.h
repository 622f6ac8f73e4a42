// The worker process's control loop: register, heartbeat (long-poll), act on commands.
//
// The agent never trains on its own thread: each JoinJob command starts a GenerationRun;
// heartbeats keep flowing while it trains, so the coordinator sees the worker alive and can
// abort the run at once. Nor does it tear runs down there (see worker/run_sequencer.h): a slow
// teardown must not stop the heartbeats. When the coordinator is unreachable the agent retries
// with backoff (a restarted coordinator finds its workers again); when it has forgotten this
// worker (FAILED_PRECONDITION) the agent drops any run and registers again; a Stop command ends
// it. What the process logs while in a run travels to the coordinator with the heartbeats
// (LogRelay), for `trainctl logs`.
#ifndef WEFT_WORKER_AGENT_H_
#define WEFT_WORKER_AGENT_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "client/coordinator_client.h"
#include "client/worker_session.h"
#include "worker/generation_run.h"
#include "worker/log_relay.h"
#include "worker/run_sequencer.h"
#include "worker/worker_metrics.h"
#include "weft/v1/worker.pb.h"

namespace weft::worker {

struct AgentOptions {
  std::string coordinator;  // host:port
  // Pings on the channel to the coordinator, so that this worker sees a cut link and
  // reconnects (the coordinator sees it through its own pings).
  KeepaliveOptions keepalive = kDefaultKeepalive;
  weft::v1::WorkerInfo info;
  RunOptions run;
};

class WorkerAgent {
 public:
  WorkerAgent(AgentOptions options, std::shared_ptr<prometheus::Registry> registry);

  // Runs until `stop` becomes true or the coordinator sends Stop. Returns OK on a requested
  // stop, FAILED_PRECONDITION with the coordinator's reason on a Stop command.
  absl::Status Run(const std::atomic<bool>& stop);

 private:
  // Registers until it works (or `stop`); with `running`, asks to attach to that generation
  // again and says whether the coordinator agreed (false also when stopped).
  absl::StatusOr<bool> RegisterWithRetry(const std::atomic<bool>& stop,
                                         const weft::v1::RunningGeneration* running = nullptr);
  // The coordinator does not know this process (it restarted): registers again, keeping the
  // run when the coordinator kept its generation.
  absl::Status RegisterAgain(const std::atomic<bool>& stop);
  // Applies one command; returns non-OK for Stop.
  absl::Status Apply(const weft::v1::Command& command);
  void DropRun(const absl::Status& reason);

  AgentOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  CoordinatorClient client_;
  // Lets the coordinator see this process exit (see client/worker_session.h).
  WorkerSession session_;
  WorkerMetrics metrics_;
  // This process's log lines while in a run, sent with the heartbeats (see log_relay.h).
  std::shared_ptr<LogRelay> log_relay_;
  int64_t interval_ms_ = 500;
  // The current run: started, or about to be once the runs before it are torn down.
  std::unique_ptr<GenerationRun> run_;
  // After run_, so that it is destroyed first, while run_ (which it may still start) lives.
  RunSequencer runs_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_AGENT_H_
