// Starts and tears down the agent's generation runs on a thread of its own, in the order asked.
//
// Tearing a run down joins its thread, which can take as long as the run's last checkpoint
// upload; on the heartbeat thread that would stop heartbeats and get a healthy worker declared
// dead. Order still matters: a new run starts only after every run retired before it is gone,
// so that runs never overlap on the device, in the metrics or in checkpointd.
#ifndef WEFT_WORKER_RUN_SEQUENCER_H_
#define WEFT_WORKER_RUN_SEQUENCER_H_

#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/generation_run.h"

namespace weft::worker {

class RunSequencer {
 public:
  RunSequencer();
  // Finishes the teardowns queued (starts still queued are dropped), then stops.
  ~RunSequencer();

  // Starts `run` once the runs retired before this call are torn down. `run` must stay alive
  // until then: retiring it through Retire() guarantees that.
  void Start(GenerationRun* run);
  // Destroys `run` (its owner aborted it or it finished) after the work queued before.
  void Retire(std::unique_ptr<GenerationRun> run);
  // Waits until everything queued so far is done.
  void Drain();

 private:
  struct Task {
    GenerationRun* start = nullptr;
    std::unique_ptr<GenerationRun> retire;
  };
  void Push(Task task);
  void Loop();
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  // A task taken off the queue and not done yet.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_RUN_SEQUENCER_H_
