#include "worker/worker_metrics.h"

#include "common/metrics.h"

namespace weft::worker {

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry, const std::string& worker_id)
    : labels_({{"worker_id", worker_id}}) {
  step_ = &AddGauge(registry, "weft_worker_step", "Last completed optimizer step", labels_);
  loss_ = &AddGauge(registry, "weft_worker_loss", "Training loss of the last step (global batch)",
                    labels_);
  val_loss_ = &AddGauge(registry, "weft_worker_val_loss", "Last validation loss", labels_);
  tokens_per_s_ = &AddGauge(registry, "weft_worker_tokens_per_second",
                            "Tokens per second of the whole job over the last step", labels_);
  grad_norm_ =
      &AddGauge(registry, "weft_worker_grad_norm", "Global gradient norm before clipping", labels_);
  learning_rate_ =
      &AddGauge(registry, "weft_worker_learning_rate", "Learning rate of the last step", labels_);
  state_bytes_ = &AddGauge(registry, "weft_worker_state_bytes",
                           "Parameters + gradients + optimizer state held by this rank", labels_);
  busy_ =
      &AddGauge(registry, "weft_worker_busy", "1 while the worker is in a job generation", labels_);
  phase_seconds_ = &prometheus::BuildGauge()
                        .Name("weft_worker_step_phase_seconds")
                        .Help("Time split of the last step: forward, backward, exposed "
                              "communication, optimizer, total")
                        .Register(registry);
  steps_ = &AddCounter(registry, "weft_worker_steps_total", "Optimizer steps completed", labels_);
  runs_ = &prometheus::BuildCounter()
               .Name("weft_worker_generation_runs_total")
               .Help("Job generations this worker took part in, by outcome")
               .Register(registry);
}

void WorkerMetrics::RecordStep(int64_t step, const StepResult& result, double tokens_per_s,
                               size_t state_bytes) {
  step_->Set(static_cast<double>(step));
  loss_->Set(result.loss);
  tokens_per_s_->Set(tokens_per_s);
  grad_norm_->Set(result.grad_norm);
  learning_rate_->Set(result.learning_rate);
  state_bytes_->Set(static_cast<double>(state_bytes));
  steps_->Increment();
  const auto& t = result.timings;
  auto phase = [&](const char* name, double ms) {
    prometheus::Labels labels = labels_;
    labels["phase"] = name;
    phase_seconds_->Add(labels).Set(ms / 1000.0);
  };
  phase("forward", t.forward_ms);
  phase("backward", t.backward_ms);
  phase("exposed_comm", t.exposed_comm_ms);
  phase("optimizer", t.optimizer_ms);
  phase("total", t.step_ms);
}

void WorkerMetrics::CountRunEnd(const std::string& outcome) {
  prometheus::Labels labels = labels_;
  labels["outcome"] = outcome;
  runs_->Add(labels).Increment();
}

}  // namespace weft::worker
