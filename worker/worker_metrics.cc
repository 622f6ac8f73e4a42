#include "worker/worker_metrics.h"

#include <cmath>

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
  step_seconds_ = &AddGauge(registry, "weft_worker_step_seconds",
                            "Wall time of the last optimizer step", labels_);
  compute_seconds_ = &AddGauge(
      registry, "weft_worker_compute_seconds",
      "Forward + backward + optimizer time of the last step, without exposed communication: "
      "the slowest rank's against the median shows a straggler",
      labels_);
  mfu_ = &AddGauge(registry, "weft_worker_mfu_ratio",
                   "Model FLOPs utilisation of this rank over the last step (0-1)", labels_);
  checkpoint_stall_ = &AddGauge(registry, "weft_worker_checkpoint_stall_seconds",
                                "Training time the last checkpoint's snapshot took", labels_);
  checkpoint_upload_ = &AddGauge(registry, "weft_worker_checkpoint_upload_seconds",
                                 "Upload time of the last committed checkpoint (rank 0)", labels_);
  checkpoint_failures_ =
      &AddCounter(registry, "weft_worker_checkpoint_failures_total",
                  "Saves of this rank that were not stored (each reported; the job records one "
                  "CHECKPOINT_FAILED event per checkpoint)",
                  labels_);
  phase_seconds_ = &prometheus::BuildGauge()
                        .Name("weft_worker_step_phase_seconds")
                        .Help("Time split of the last step: forward, backward, exposed "
                              "communication, optimizer, total")
                        .Register(registry);
  steps_ = &AddCounter(registry, "weft_worker_steps_total", "Optimizer steps completed", labels_);
  skipped_steps_ = &AddCounter(registry, "weft_worker_steps_skipped_total",
                               "Steps skipped because their gradient was not finite (parameters "
                               "and optimizer state left as they were)",
                               labels_);
  auto& fp8_values = prometheus::BuildCounter()
                         .Name("weft_worker_fp8_values_total")
                         .Help(
                             "Values this rank's FP8 casts took (precision FP8), by format "
                             "(e4m3: the Linear layers' inputs and weights, e5m2: their output "
                             "gradients) and outcome: cast (all), underflow (not zero, cast "
                             "to zero), saturated (beyond the format's largest value)")
                         .Register(registry);
  const char* const kFormats[] = {"e4m3", "e5m2"};
  const char* const kOutcomes[] = {"cast", "underflow", "saturated"};
  for (int f = 0; f < 2; ++f) {
    for (int o = 0; o < 3; ++o) {
      prometheus::Labels labels = labels_;
      labels["format"] = kFormats[f];
      labels["outcome"] = kOutcomes[o];
      fp8_values_[f][o] = &fp8_values.Add(labels);
    }
  }
  auto& collective_bytes = prometheus::BuildCounter()
                               .Name("weft_worker_collective_bytes_total")
                               .Help("Bytes this rank's collectives sent in training steps, as "
                                     "ring algorithms send them, by link: intra_host (ranks "
                                     "of its host) or inter_host (communicators spanning hosts)")
                               .Register(registry);
  prometheus::Labels intra = labels_, inter = labels_;
  intra["link"] = "intra_host";
  inter["link"] = "inter_host";
  intra_host_bytes_ = &collective_bytes.Add(intra);
  inter_host_bytes_ = &collective_bytes.Add(inter);
  job_info_ = &prometheus::BuildGauge()
                   .Name("weft_worker_job_info")
                   .Help("1, labelled with the job and rank of the worker's current or last "
                         "generation")
                   .Register(registry);
  runs_ = &prometheus::BuildCounter()
               .Name("weft_worker_generation_runs_total")
               .Help("Job generations this worker took part in, by outcome")
               .Register(registry);
}

void WorkerMetrics::RecordStep(int64_t step, const zero::StepResult& result, double tokens_per_s,
                               double mfu, size_t state_bytes) {
  step_->Set(static_cast<double>(step));
  loss_->Set(result.loss);
  tokens_per_s_->Set(tokens_per_s);
  grad_norm_->Set(result.grad_norm);
  learning_rate_->Set(result.learning_rate);
  state_bytes_->Set(static_cast<double>(state_bytes));
  steps_->Increment();
  if (!std::isfinite(result.grad_norm)) skipped_steps_->Increment();
  const zero::Fp8Tally* tallies[] = {&result.fp8_e4m3, &result.fp8_e5m2};
  for (int f = 0; f < 2; ++f) {
    fp8_values_[f][0]->Increment(static_cast<double>(tallies[f]->values));
    fp8_values_[f][1]->Increment(static_cast<double>(tallies[f]->underflows));
    fp8_values_[f][2]->Increment(static_cast<double>(tallies[f]->saturated));
  }
  const auto& t = result.timings;
  step_seconds_->Set(t.step_ms / 1000.0);
  compute_seconds_->Set((t.forward_ms + t.backward_ms + t.optimizer_ms) / 1000.0);
  mfu_->Set(mfu);
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

void WorkerMetrics::SetAssignment(const std::string& job_id, int32_t rank) {
  if (assignment_ != nullptr) job_info_->Remove(assignment_);
  prometheus::Labels labels = labels_;
  labels["job_id"] = job_id;
  labels["rank"] = std::to_string(rank);
  assignment_ = &job_info_->Add(labels);
  assignment_->Set(1);
}

void WorkerMetrics::CountRunEnd(const std::string& outcome) {
  prometheus::Labels labels = labels_;
  labels["outcome"] = outcome;
  runs_->Add(labels).Increment();
}

void WorkerMetrics::CountCollectiveBytes(int64_t intra_host, int64_t inter_host) {
  intra_host_bytes_->Increment(static_cast<double>(intra_host));
  inter_host_bytes_->Increment(static_cast<double>(inter_host));
}

}  // namespace weft::worker
