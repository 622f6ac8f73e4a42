// One generation of one job on this worker: rendezvous, communicator, data, training loop,
// reports, final model. Runs on its own thread; the agent's heartbeat thread keeps the worker
// alive meanwhile and calls Abort() when the coordinator ends the generation.
#ifndef WEFT_WORKER_GENERATION_RUN_H_
#define WEFT_WORKER_GENERATION_RUN_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/checkpoint_client.h"
#include "client/coordinator_client.h"
#include "common/store.h"
#include "worker/zero_cpu.h"
#include "worker/comm/communicator.h"
#include "worker/worker_metrics.h"
#include "weft/v1/worker.pb.h"

namespace weft::worker {

struct RunOptions {
  std::string worker_id;
  int64_t incarnation = 0;
  // Address other ranks reach this worker at (the Gloo listening address).
  std::string data_address = "127.0.0.1";
  // Where rank 0 writes the final model: <output_dir>/<job_id>/model.safetensors.
  std::string output_dir;
  int64_t collective_timeout_ms = 60000;
  // checkpointd host:port; empty: no checkpoints are saved or restored.
  std::string checkpointd;
  // CUDA device this worker trains on; -1: the CPU engine.
  int cuda_device = -1;
  int64_t rendezvous_timeout_ms = 120000;
  // Peak FLOP/s of this worker's device, the denominator of MFU.
  double peak_flops = 989e12;
};

class GenerationRun {
 public:
  GenerationRun(const weft::v1::JoinJobCommand& command, const RunOptions& options,
                CoordinatorClient* client, WorkerMetrics* metrics);
  // Aborts and joins the thread.
  ~GenerationRun();

  void Start();
  // Ends the run as soon as possible: in-flight collectives fail at once. Thread-safe.
  void Abort(const absl::Status& reason);
  bool Finished() const { return finished_.load(); }

  const std::string& job_id() const { return command_.job_id(); }
  int64_t generation() const { return command_.generation(); }
  int64_t step() const { return step_.load(); }

 private:
  void Run();
  absl::Status Train();
  // Tells the coordinator this rank failed (unless the run was aborted: then it is expected).
  void ReportError(const absl::Status& status, bool permanent);
  // A collective failed. When a peer died, the survivors' collectives fail at once (the TCP
  // connection resets) while the coordinator needs up to a heartbeat timeout to see the death;
  // reporting at once would blame this healthy rank. So wait for the coordinator's verdict
  // first, and report only if it does not end the generation.
  void ReportCollectiveError(const absl::Status& status);
  // Gloo for CPU runs, NCCL on options_.cuda_device for GPU runs; then the matching engine.
  absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateCommunicator(Store* store,
                                                                         int world);
  absl::StatusOr<std::unique_ptr<TrainingEngine>> CreateEngine(const weft::v1::JobSpec& spec,
                                                               comm::Communicator* comm);
  // Restores the newest checkpoint every rank can read (this job's, else resume_from_job's),
  // falling back to older ones; returns its step, 0 when there is none.
  absl::StatusOr<int64_t> RestoreLatest(TrainingEngine* engine, comm::Communicator* comm,
                                        Store* store, CheckpointClient* client);

  const weft::v1::JoinJobCommand command_;
  const RunOptions options_;
  CoordinatorClient* client_;
  WorkerMetrics* metrics_;
  // As assigned by the JoinJob command; Join confirms it.
  int32_t rank_;

  absl::Mutex mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
  comm::Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;

  std::atomic<bool> aborted_{false};
  std::atomic<bool> finished_{false};
  std::atomic<int64_t> step_{0};
  std::thread thread_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_GENERATION_RUN_H_
