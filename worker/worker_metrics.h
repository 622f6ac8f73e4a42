// The worker's Prometheus metrics (weft_worker_*), labelled with the worker id.
#ifndef WEFT_WORKER_WORKER_METRICS_H_
#define WEFT_WORKER_WORKER_METRICS_H_

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "worker/zero.h"

namespace weft::worker {

class WorkerMetrics {
 public:
  WorkerMetrics(prometheus::Registry& registry, const std::string& worker_id);

  void RecordStep(int64_t step, const StepResult& result, double tokens_per_s, size_t state_bytes);
  void RecordValidation(double val_loss) { val_loss_->Set(val_loss); }
  void SetBusy(bool busy) { busy_->Set(busy ? 1 : 0); }
  void CountRunEnd(const std::string& outcome);

 private:
  prometheus::Gauge* step_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* val_loss_;
  prometheus::Gauge* tokens_per_s_;
  prometheus::Gauge* grad_norm_;
  prometheus::Gauge* learning_rate_;
  prometheus::Gauge* state_bytes_;
  prometheus::Gauge* busy_;
  prometheus::Family<prometheus::Gauge>* phase_seconds_;
  prometheus::Counter* steps_;
  prometheus::Family<prometheus::Counter>* runs_;
  prometheus::Labels labels_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_WORKER_METRICS_H_
