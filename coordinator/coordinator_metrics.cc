#include "coordinator/coordinator_metrics.h"

#include <utility>
#include <vector>

#include "common/metrics.h"

namespace weft::coordinator {
namespace {

using weft::v1::JobState;
using weft::v1::WorkerState;

constexpr JobState kAllJobStates[] = {weft::v1::PENDING,   weft::v1::RUNNING,
                                      weft::v1::RECOVERING, weft::v1::SUCCEEDED,
                                      weft::v1::FAILED,    weft::v1::CANCELLED};
constexpr WorkerState kAllWorkerStates[] = {weft::v1::WORKER_IDLE, weft::v1::WORKER_BUSY,
                                            weft::v1::WORKER_DEAD};

// The liveness failures and their `kind` labels.
constexpr std::pair<FailureKind, const char*> kFailureKinds[] = {
    {FailureKind::kHeartbeatTimeout, "heartbeat_timeout"},
    {FailureKind::kRendezvousTimeout, "rendezvous_timeout"},
    {FailureKind::kStall, "stall"},
    {FailureKind::kConnectionLost, "connection_lost"},
    {FailureKind::kReattachTimeout, "reattach_timeout"},
};

template <typename Builder>
auto* Register(Builder builder, prometheus::Registry& registry, const char* name,
               const char* help) {
  return &builder.Name(name).Help(help).Register(registry);
}

}  // namespace

std::string_view FailureKindLabel(FailureKind kind) {
  for (const auto& [k, label] : kFailureKinds) {
    if (k == kind) return label;
  }
  return "unknown";
}

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry) {
  jobs_ = Register(prometheus::BuildGauge(), registry, "weft_coordinator_jobs", "Jobs by state");
  for (JobState s : kAllJobStates) jobs_->Add({{"state", JobState_Name(s)}});
  workers_ = Register(prometheus::BuildGauge(), registry, "weft_coordinator_workers",
                      "Registered workers by state");
  for (WorkerState s : kAllWorkerStates) workers_->Add({{"state", WorkerState_Name(s)}});
  heartbeats_ = &AddCounter(registry, "weft_coordinator_heartbeats_total", "Heartbeats received");
  jobs_submitted_ = &AddCounter(registry, "weft_coordinator_jobs_submitted_total",
                                "Jobs accepted by SubmitJob");
  rendezvous_latency_ = &AddHistogram(registry, "weft_coordinator_rendezvous_latency_seconds",
                                      "From a generation's assignment to its last member joining",
                                      ExponentialBuckets(0.001, 2.0, 18));
  failures_ = Register(prometheus::BuildCounter(), registry,
                       "weft_coordinator_failures_detected_total",
                       "Failures that ended a generation or marked a worker dead, by kind");
  for (const auto& [kind, label] : kFailureKinds) failures_->Add({{"kind", label}});
  for (const char* kind : {"rank_error", "reregistered"}) failures_->Add({{"kind", kind}});
  generations_started_ = &AddCounter(registry, "weft_coordinator_generations_started_total",
                                     "Job generations formed (first starts and restarts)");
  assignments_resent_ =
      &AddCounter(registry, "weft_coordinator_assignments_resent_total",
                  "JoinJob commands sent again because the answer that carried them was lost");
  recoveries_ = Register(prometheus::BuildCounter(), registry, "weft_coordinator_recoveries_total",
                         "Generation failures a job recovers from (it goes RECOVERING), by job");
  job_events_ = Register(prometheus::BuildCounter(), registry, "weft_coordinator_job_events_total",
                         "Job events (trainctl events), by job and type");
  heartbeat_age_ = Register(prometheus::BuildGauge(), registry,
                            "weft_coordinator_worker_heartbeat_age_seconds",
                            "Time since each live worker's last heartbeat");
  const std::pair<const char*, const char*> job_gauges[kJobGaugeCount] = {
      {"weft_coordinator_job_step", "Last step rank 0 reported"},
      {"weft_coordinator_job_loss", "Training loss rank 0 reported last"},
      {"weft_coordinator_job_tokens_per_second", "Tokens per second of the whole job"},
      {"weft_coordinator_job_mfu_ratio", "Model FLOPs utilisation per rank (0-1)"},
      {"weft_coordinator_job_step_seconds", "Wall time of the last step"},
      {"weft_coordinator_job_checkpoint_stall_seconds",
       "Training time the last committed checkpoint's snapshot took"},
      {"weft_coordinator_job_checkpoint_save_seconds",
       "Upload-to-commit time of the last committed checkpoint"},
      {"weft_coordinator_job_checkpoint_timestamp_seconds",
       "When the job's newest checkpoint committed, or before its first when the job started "
       "(Unix time): time() minus it is the training a crash now would lose"},
      {"weft_coordinator_job_checkpoint_interval_steps",
       "Steps between checkpoints of a running job (absent once it stops running)"},
  };
  for (int i = 0; i < kJobGaugeCount; ++i) {
    job_gauges_[i] =
        Register(prometheus::BuildGauge(), registry, job_gauges[i].first, job_gauges[i].second);
  }
}

void CoordinatorMetrics::CountHeartbeat() { heartbeats_->Increment(); }

void CoordinatorMetrics::CountJobSubmitted(const std::string& job_id) {
  jobs_submitted_->Increment();
  recoveries_->Add({{"job_id", job_id}});
}

void CoordinatorMetrics::CountGenerationStarted() { generations_started_->Increment(); }

void CoordinatorMetrics::CountAssignmentResent() { assignments_resent_->Increment(); }

void CoordinatorMetrics::ObserveRendezvous(absl::Duration took) {
  rendezvous_latency_->Observe(absl::ToDoubleSeconds(took));
}

void CoordinatorMetrics::CountFailure(std::string_view kind) {
  failures_->Add({{"kind", std::string(kind)}}).Increment();
}

void CoordinatorMetrics::CountRecovery(const std::string& job_id) {
  recoveries_->Add({{"job_id", job_id}}).Increment();
}

void CoordinatorMetrics::CountJobEvent(const std::string& job_id, weft::v1::JobEventType type) {
  job_events_->Add({{"job_id", job_id}, {"type", JobEventType_Name(type)}}).Increment();
}

void CoordinatorMetrics::SetHeartbeatAge(const std::string& worker_id,
                                         std::optional<absl::Duration> age) {
  const prometheus::Labels worker{{"worker_id", worker_id}};
  if (age) {
    heartbeat_age_->Add(worker).Set(absl::ToDoubleSeconds(*age));
  } else if (heartbeat_age_->Has(worker)) {
    heartbeat_age_->Remove(&heartbeat_age_->Add(worker));
  }
}

void CoordinatorMetrics::SetStateCounts(const absl::flat_hash_map<int, int>& jobs_by_state,
                                        const absl::flat_hash_map<int, int>& workers_by_state) {
  auto count = [](const absl::flat_hash_map<int, int>& counts, int state) {
    auto it = counts.find(state);
    return it == counts.end() ? 0 : it->second;
  };
  for (JobState s : kAllJobStates) {
    jobs_->Add({{"state", JobState_Name(s)}}).Set(count(jobs_by_state, s));
  }
  for (WorkerState s : kAllWorkerStates) {
    workers_->Add({{"state", WorkerState_Name(s)}}).Set(count(workers_by_state, s));
  }
}

void CoordinatorMetrics::SetJobGauge(JobGauge gauge, const std::string& job_id, double value) {
  job_gauges_[gauge]->Add({{"job_id", job_id}}).Set(value);
}

void CoordinatorMetrics::SetStepMetrics(const std::string& job_id, int64_t step,
                                        const weft::v1::StepMetrics& m) {
  SetJobGauge(kStep, job_id, static_cast<double>(step));
  SetJobGauge(kLoss, job_id, m.loss());
  SetJobGauge(kTokensPerSecond, job_id, m.tokens_per_s());
  SetJobGauge(kMfu, job_id, m.mfu());
  SetJobGauge(kStepSeconds, job_id, m.step_ms() / 1000.0);
}

void CoordinatorMetrics::SetCheckpointTimes(const std::string& job_id, double stall_ms,
                                            double save_ms, absl::Time committed) {
  SetJobGauge(kCheckpointStall, job_id, stall_ms / 1000.0);
  SetJobGauge(kCheckpointSave, job_id, save_ms / 1000.0);
  SetJobGauge(kCheckpointTime, job_id, absl::ToDoubleSeconds(committed - absl::UnixEpoch()));
}

void CoordinatorMetrics::SetUncheckpointedSince(const std::string& job_id, absl::Time started) {
  SetJobGauge(kCheckpointTime, job_id, absl::ToDoubleSeconds(started - absl::UnixEpoch()));
}

void CoordinatorMetrics::SetCheckpointIntervalSteps(const std::string& job_id, int64_t steps) {
  const prometheus::Labels job{{"job_id", job_id}};
  Family<prometheus::Gauge>* family = job_gauges_[kCheckpointIntervalSteps];
  if (steps > 0) {
    family->Add(job).Set(static_cast<double>(steps));
  } else if (family->Has(job)) {
    family->Remove(&family->Add(job));
  }
}

void CoordinatorMetrics::EndJob(const std::string& job_id, absl::Time now) {
  absl::MutexLock lock(&ended_mu_);
  ended_.emplace(job_id, now);
}

void CoordinatorMetrics::RemoveEndedJobs(absl::Time now) {
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&ended_mu_);
    for (const auto& [job_id, end] : ended_) {
      if (now - end >= kEndedJobRetention) expired.push_back(job_id);
    }
    for (const std::string& job_id : expired) ended_.erase(job_id);
  }
  for (const std::string& job_id : expired) RemoveJobSeries(job_id);
}

void CoordinatorMetrics::RemoveJobSeries(const std::string& job_id) {
  auto remove = [](auto* family, const prometheus::Labels& labels) {
    if (family->Has(labels)) family->Remove(&family->Add(labels));
  };
  const prometheus::Labels job{{"job_id", job_id}};
  remove(recoveries_, job);
  for (auto* gauges : job_gauges_) remove(gauges, job);
  const auto* types = weft::v1::JobEventType_descriptor();
  for (int i = 0; i < types->value_count(); ++i) {
    remove(job_events_, {{"job_id", job_id}, {"type", types->value(i)->name()}});
  }
}

}  // namespace weft::coordinator
