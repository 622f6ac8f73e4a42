// The worker's Prometheus metrics (weft_worker_*), labelled with the worker id.
#ifndef WEFT_WORKER_WORKER_METRICS_H_
#define WEFT_WORKER_WORKER_METRICS_H_

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "worker/zero/training_engine.h"

namespace weft::worker {

class WorkerMetrics {
 public:
  WorkerMetrics(prometheus::Registry& registry, const std::string& worker_id);

  void RecordStep(int64_t step, const zero::StepResult& result, double tokens_per_s, double mfu,
                  size_t state_bytes);
  // Training time lost to taking a checkpoint's snapshot (every rank), and the upload time of
  // a committed checkpoint (rank 0, which learns of commits).
  void RecordCheckpointStall(double ms) { checkpoint_stall_->Set(ms / 1000.0); }
  void RecordCheckpointUpload(double ms) { checkpoint_upload_->Set(ms / 1000.0); }
  // A save of this rank that was not stored.
  void CountCheckpointFailure() { checkpoint_failures_->Increment(); }
  void RecordValidation(double val_loss) { val_loss_->Set(val_loss); }
  void SetBusy(bool busy) { busy_->Set(busy ? 1 : 0); }
  // weft_worker_job_info{job_id, rank} = 1 for the worker's current (or, once it ended, last)
  // generation: dashboards join per-rank metrics with it to select a job's ranks.
  void SetAssignment(const std::string& job_id, int32_t rank);
  void CountRunEnd(const std::string& outcome);
  // What this rank's collectives sent in a step (Communicator::sent_bytes), to ranks of its
  // own host and over communicators that span hosts.
  void CountCollectiveBytes(int64_t intra_host, int64_t inter_host);

 private:
  // The last step's figures.
  prometheus::Gauge* step_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* grad_norm_;
  prometheus::Gauge* learning_rate_;
  prometheus::Counter* steps_;
  prometheus::Counter* skipped_steps_;
  // weft_worker_fp8_values_total by format (e4m3, e5m2) and outcome (cast, underflow,
  // saturated): [format][outcome].
  prometheus::Counter* fp8_values_[2][3] = {};
  // Its speed.
  prometheus::Gauge* tokens_per_s_;
  prometheus::Gauge* mfu_;
  prometheus::Gauge* step_seconds_;
  prometheus::Gauge* compute_seconds_;
  prometheus::Family<prometheus::Gauge>* phase_seconds_;
  // Memory, validation, checkpoints.
  prometheus::Gauge* state_bytes_;
  prometheus::Gauge* val_loss_;
  prometheus::Gauge* checkpoint_stall_;
  prometheus::Gauge* checkpoint_upload_;
  prometheus::Counter* checkpoint_failures_;
  // The worker's assignment and its runs.
  prometheus::Gauge* busy_;
  prometheus::Family<prometheus::Gauge>* job_info_;
  prometheus::Gauge* assignment_ = nullptr;
  prometheus::Family<prometheus::Counter>* runs_;
  prometheus::Counter* intra_host_bytes_;
  prometheus::Counter* inter_host_bytes_;
  prometheus::Labels labels_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_WORKER_METRICS_H_
