// The coordinator's Prometheus metrics: one object owning every family, with one method per
// thing the coordinator counts or sets. prometheus-cpp metrics are thread-safe, so these need
// no coordinator lock. Labels follow the repository's rule: jobs are `job_id`, workers
// `worker_id` (a bare `job` would be shadowed by the scrape's own job label).
#ifndef WEFT_COORDINATOR_COORDINATOR_METRICS_H_
#define WEFT_COORDINATOR_COORDINATOR_METRICS_H_

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/decisions.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "weft/v1/job.pb.h"

namespace weft::coordinator {

// The `kind` label of weft_coordinator_failures_detected_total for a liveness failure.
std::string_view FailureKindLabel(FailureKind kind);

class CoordinatorMetrics {
 public:
  // Registers every family in `registry`, with the series that must read 0 rather than be
  // missing (each job and worker state, each failure kind).
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  void CountHeartbeat();
  // A new job: counted, and its recoveries series exists at 0 ("none" rather than no data).
  void CountJobSubmitted(const std::string& job_id);
  void CountGenerationStarted();
  void CountAssignmentResent();
  void ObserveRendezvous(absl::Duration took);
  // `kind`: FailureKindLabel(...), "rank_error" or "reregistered".
  void CountFailure(std::string_view kind);
  void CountRecovery(const std::string& job_id);
  void CountJobEvent(const std::string& job_id, weft::v1::JobEventType type);
  // The time since a live worker's last heartbeat; nullopt for a dead worker, whose series is
  // removed (its age would only grow: the series going shows the worker is gone).
  void SetHeartbeatAge(const std::string& worker_id, std::optional<absl::Duration> age);
  // How many jobs and workers are in each state (keyed by enum value; absent: 0).
  void SetStateCounts(const absl::flat_hash_map<int, int>& jobs_by_state,
                      const absl::flat_hash_map<int, int>& workers_by_state);
  // What rank 0 reported last, labelled by job.
  void SetStepMetrics(const std::string& job_id, int64_t step, const weft::v1::StepMetrics& m);
  // A committed checkpoint: its stall and save times, and when it committed (Unix seconds),
  // from which dashboards and alerts take the age of a job's newest checkpoint.
  void SetCheckpointTimes(const std::string& job_id, double stall_ms, double save_ms,
                          absl::Time committed);
  // Before a job's first commit, the time its training started stands in for the newest
  // checkpoint's: what a crash would lose is everything since then, and the stale-checkpoint
  // alert must be able to fire for a job whose first checkpoint never commits.
  void SetUncheckpointedSince(const std::string& job_id, absl::Time started);
  // The checkpoint interval (spec's checkpoint.interval_steps) of a RUNNING job; `steps` 0
  // (a job not running, or without checkpoints) removes the series. The stale-checkpoint
  // alert of deploy/prometheus/rules.yml multiplies by it, so it fires only for running jobs.
  void SetCheckpointIntervalSteps(const std::string& job_id, int64_t steps);

  // How long an ended job's series stay: long enough for every scrape (intervals of 15-60 s)
  // to see its final values, short enough that the series count follows the live jobs rather
  // than the job history.
  static constexpr absl::Duration kEndedJobRetention = absl::Minutes(5);
  // `job_id` reached a final state at `now`: its series (every family with a job_id label)
  // go kEndedJobRetention later, at the first RemoveEndedJobs after that.
  void EndJob(const std::string& job_id, absl::Time now);
  void RemoveEndedJobs(absl::Time now);

 private:
  template <typename M>
  using Family = prometheus::Family<M>;
  void RemoveJobSeries(const std::string& job_id);

  // The per-job gauges of rank 0's reports, indexed by JobGauge.
  enum JobGauge { kStep, kLoss, kTokensPerSecond, kMfu, kStepSeconds, kCheckpointStall,
                  kCheckpointSave, kCheckpointTime, kCheckpointIntervalSteps, kJobGaugeCount };
  void SetJobGauge(JobGauge gauge, const std::string& job_id, double value);

  Family<prometheus::Gauge>* jobs_;
  Family<prometheus::Gauge>* workers_;
  prometheus::Counter* heartbeats_;
  prometheus::Counter* jobs_submitted_;
  prometheus::Histogram* rendezvous_latency_;
  Family<prometheus::Counter>* failures_;
  prometheus::Counter* generations_started_;
  prometheus::Counter* assignments_resent_;
  Family<prometheus::Counter>* recoveries_;
  Family<prometheus::Counter>* job_events_;
  Family<prometheus::Gauge>* heartbeat_age_;
  std::array<Family<prometheus::Gauge>*, kJobGaugeCount> job_gauges_;
  absl::Mutex ended_mu_;
  absl::flat_hash_map<std::string, absl::Time> ended_ ABSL_GUARDED_BY(ended_mu_);  // job -> end
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_COORDINATOR_METRICS_H_
