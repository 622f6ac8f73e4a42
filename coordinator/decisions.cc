#include "coordinator/decisions.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace weft::coordinator {
namespace {

std::string KindName(weft::v1::DeviceKind kind) {
  switch (kind) {
    case weft::v1::DEVICE_KIND_CPU:
      return "CPU";
    case weft::v1::DEVICE_KIND_CUDA:
      return "CUDA";
    default:
      return "unspecified-device";
  }
}

int64_t Ms(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

void SortInRankOrder(std::vector<IdleWorkerView>* workers) {
  std::sort(workers->begin(), workers->end(), [](const auto& a, const auto& b) {
    return std::tie(a.host_id, a.device_index, a.worker_id) <
           std::tie(b.host_id, b.device_index, b.worker_id);
  });
}

void SortInPlacementOrder(std::vector<IdleWorkerView>* workers) {
  absl::flat_hash_map<std::string_view, size_t> idle_on_host;
  for (const auto& w : *workers) ++idle_on_host[w.host_id];
  std::sort(workers->begin(), workers->end(), [&](const auto& a, const auto& b) {
    const size_t na = idle_on_host[a.host_id];
    const size_t nb = idle_on_host[b.host_id];
    if (na != nb) return na > nb;
    return std::tie(a.host_id, a.device_index, a.worker_id) <
           std::tie(b.host_id, b.device_index, b.worker_id);
  });
}

namespace {

// Schedule's first phase, by counts of idle workers alone: which jobs wait (and why), and how
// many workers each job that can be placed takes.
struct CountPlan {
  std::vector<std::pair<std::string, std::string>> waiting;
  std::vector<std::pair<const WaitingJobView*, size_t>> placed;  // job, workers to take
};

CountPlan PlanByCounts(const std::vector<WaitingJobView>& jobs, IdleCounts available) {
  CountPlan plan;
  // Kinds whose queue head could not be placed: everything behind it waits.
  absl::flat_hash_map<weft::v1::DeviceKind, std::string> blocked_by;

  for (const auto& job : jobs) {
    size_t& count = available[job.device_kind];
    if (auto it = blocked_by.find(job.device_kind); it != blocked_by.end()) {
      plan.waiting.emplace_back(
          job.job_id, absl::StrCat("queued behind job ", it->second, " (first come, first served)"));
      continue;
    }
    if (count < static_cast<size_t>(std::max(job.min_workers, 0))) {
      plan.waiting.emplace_back(
          job.job_id, absl::StrCat("needs ", job.min_workers, " idle ", KindName(job.device_kind),
                                   " worker", job.min_workers == 1 ? "" : "s", ", ", count,
                                   " idle"));
      blocked_by[job.device_kind] = job.job_id;
      continue;
    }
    size_t take = std::min<size_t>(count, std::max(job.max_workers, job.min_workers));
    take -= take % static_cast<size_t>(std::max(job.world_multiple, 1));
    count -= take;
    plan.placed.emplace_back(&job, take);
  }
  return plan;
}

}  // namespace

std::optional<ScheduleDecision> WaitingByCounts(const std::vector<WaitingJobView>& jobs,
                                                const IdleCounts& idle) {
  CountPlan plan = PlanByCounts(jobs, idle);
  if (!plan.placed.empty()) return std::nullopt;
  ScheduleDecision decision;
  decision.waiting = std::move(plan.waiting);
  return decision;
}

ScheduleDecision Schedule(const std::vector<WaitingJobView>& jobs,
                          const std::vector<IdleWorkerView>& idle_workers) {
  ScheduleDecision decision;
  // First decide by counts alone; only the kinds that place a job pay for sorting workers.
  IdleCounts available;
  for (const auto& w : idle_workers) ++available[w.device_kind];
  CountPlan plan = PlanByCounts(jobs, std::move(available));
  decision.waiting = std::move(plan.waiting);
  const auto& placed = plan.placed;
  if (placed.empty()) return decision;

  std::map<weft::v1::DeviceKind, std::vector<IdleWorkerView>> pool;
  for (const auto& [job, take] : placed) pool[job->device_kind];
  for (const auto& w : idle_workers) {
    if (auto it = pool.find(w.device_kind); it != pool.end()) it->second.push_back(w);
  }
  for (auto& [kind, workers] : pool) SortInPlacementOrder(&workers);
  absl::flat_hash_map<weft::v1::DeviceKind, size_t> next;  // first unassigned in each pool
  for (const auto& [job, take] : placed) {
    const auto& workers = pool[job->device_kind];
    size_t& first = next[job->device_kind];
    Placement placement;
    placement.job_id = job->job_id;
    std::vector<IdleWorkerView> taken(workers.begin() + first, workers.begin() + first + take);
    first += take;
    SortInRankOrder(&taken);
    absl::flat_hash_set<std::string_view> hosts;
    for (const auto& w : taken) {
      placement.worker_ids.emplace_back(w.worker_id);
      hosts.insert(w.host_id);
    }
    placement.reason = absl::StrCat(take, " idle ", KindName(job->device_kind), " worker",
                                    take == 1 ? "" : "s", " on ", hosts.size(), " host",
                                    hosts.size() == 1 ? "" : "s", " (min ", job->min_workers,
                                    ", max ", job->max_workers,
                                    job->world_multiple > 1
                                        ? absl::StrCat(", a multiple of the group size ",
                                                       job->world_multiple)
                                        : "",
                                    ")");
    decision.placements.push_back(std::move(placement));
  }
  return decision;
}

ScheduleDecision ScheduleSparingQuarantined(const std::vector<WaitingJobView>& jobs,
                                            const std::vector<IdleWorkerView>& healthy,
                                            const std::vector<IdleWorkerView>& quarantined) {
  ScheduleDecision decision = Schedule(jobs, healthy);
  if (quarantined.empty() || decision.waiting.empty()) return decision;
  absl::flat_hash_set<std::string_view> taken;
  for (const auto& p : decision.placements) taken.insert(p.worker_ids.begin(), p.worker_ids.end());
  std::vector<IdleWorkerView> rest = quarantined;
  for (const auto& w : healthy) {
    if (!taken.contains(w.worker_id)) rest.push_back(w);
  }
  std::vector<WaitingJobView> still_waiting;
  for (const auto& [job_id, reason] : decision.waiting) {
    for (const auto& j : jobs) {
      if (j.job_id == job_id) still_waiting.push_back(j);
    }
  }
  ScheduleDecision second = Schedule(still_waiting, rest);
  for (auto& p : second.placements) decision.placements.push_back(std::move(p));
  decision.waiting = std::move(second.waiting);
  return decision;
}

IdleHeartbeat IdleHeartbeatFor(int64_t idle_workers, const IdleHeartbeat& configured,
                               int32_t max_per_s) {
  if (max_per_s <= 0 || configured.interval_ms <= 0) return configured;
  // The interval at which `idle_workers` send max_per_s heartbeats a second, rounded up.
  const int64_t needed_ms = (idle_workers * 1000 + max_per_s - 1) / max_per_s;
  if (needed_ms <= configured.interval_ms) return configured;
  return {needed_ms, configured.timeout_ms * needed_ms / configured.interval_ms};
}

bool IsWorkerDeath(FailureKind kind) {
  return kind == FailureKind::kHeartbeatTimeout || kind == FailureKind::kConnectionLost;
}

std::vector<Failure> CheckLiveness(absl::Time now, const std::vector<WorkerLivenessView>& workers,
                                   const std::vector<GenerationView>& generations,
                                   const LivenessOptions& options) {
  std::vector<Failure> failures;
  absl::flat_hash_map<std::string, const GenerationView*> by_job;
  for (const auto& g : generations) by_job[g.job_id] = &g;

  for (const auto& w : workers) {
    if (w.state == weft::v1::WORKER_DEAD) continue;
    const GenerationView* gen = nullptr;
    if (!w.job_id.empty()) {
      auto it = by_job.find(w.job_id);
      if (it != by_job.end() && it->second->generation == w.generation) gen = it->second;
    }
    const int64_t timeout_ms = gen ? gen->heartbeat_timeout_ms : options.idle_heartbeat_timeout_ms;
    const int64_t silent_ms = Ms(now - w.last_heartbeat);
    const int64_t grace_ms = std::min(options.connection_lost_grace_ms, timeout_ms);
    if (silent_ms > timeout_ms) {
      Failure f{FailureKind::kHeartbeatTimeout, w.worker_id, gen ? gen->job_id : "",
                gen ? gen->generation : 0,
                absl::StrCat("worker ", w.worker_id, " missed heartbeats for ", silent_ms,
                             " ms (timeout ", timeout_ms, " ms)")};
      failures.push_back(std::move(f));
    } else if (w.connection_lost != absl::InfiniteFuture() &&
               Ms(now - w.connection_lost) > grace_ms) {
      failures.push_back(
          {FailureKind::kConnectionLost, w.worker_id, gen ? gen->job_id : "",
           gen ? gen->generation : 0,
           absl::StrCat("worker ", w.worker_id, " lost its connection ",
                        Ms(now - w.connection_lost), " ms ago and opened no new session since ",
                        "(grace ", grace_ms, " ms): its process exited or its host is "
                        "unreachable")});
    }
  }

  for (const auto& g : generations) {
    if (!g.not_joined.empty()) {
      const int64_t waited_ms = Ms(now - g.start_time);
      if (waited_ms > options.rendezvous_timeout_ms) {
        failures.push_back({FailureKind::kRendezvousTimeout, "", g.job_id, g.generation,
                            absl::StrCat("rendezvous of generation ", g.generation,
                                         " incomplete after ", waited_ms, " ms (timeout ",
                                         options.rendezvous_timeout_ms, " ms); not joined: ",
                                         absl::StrJoin(g.not_joined, ", "))});
      }
      continue;
    }
    const int64_t idle_ms = Ms(now - g.last_progress_time);
    if (idle_ms > g.stall_timeout_ms) {
      failures.push_back({FailureKind::kStall, "", g.job_id, g.generation,
                          absl::StrCat("generation ", g.generation, " made no progress for ",
                                       idle_ms, " ms (stall timeout ", g.stall_timeout_ms,
                                       " ms); last step ", g.step)});
    }
  }
  return failures;
}

RecoveryDecision DecideAfterFailure(int32_t restarts_so_far, int32_t max_restarts,
                                    bool permanent_error, const std::string& cause) {
  if (permanent_error) {
    return {weft::v1::FAILED, false, absl::StrCat(cause, " (permanent error: not retried)")};
  }
  if (restarts_so_far >= max_restarts) {
    return {weft::v1::FAILED, false,
            absl::StrCat(cause, "; restart budget exhausted (", restarts_so_far, " of ",
                         max_restarts, " used)")};
  }
  return {weft::v1::RECOVERING, true,
          absl::StrCat(cause, "; restarting (", restarts_so_far + 1, " of ", max_restarts, ")")};
}

RepeatDecision DecideRepeatedRankError(const std::string& previous,
                                       const std::string& previous_worker,
                                       const std::string& error, const std::string& worker) {
  if (previous.empty() || error != previous || worker == previous_worker) return {};
  return {true, absl::StrCat("the previous generation ended with this same error on worker ",
                             previous_worker,
                             ": it is the job's, not a machine's, and a restart would replay it")};
}

QuarantineDecision DecideQuarantine(absl::Time now, const std::string& worker_id,
                                    int32_t failures_so_far, const std::string& cause,
                                    const QuarantineOptions& options) {
  QuarantineDecision d;
  d.consecutive_failures = failures_so_far;
  if (options.after_failures <= 0) {
    d.reason = "quarantine disabled";
    return d;
  }
  d.consecutive_failures = failures_so_far + 1;
  if (d.consecutive_failures < options.after_failures) {
    d.reason = absl::StrCat("worker ", worker_id, " failed ", d.consecutive_failures, " of ",
                            options.after_failures, " generations in a row before quarantine");
    return d;
  }
  const absl::Time until = now + absl::Milliseconds(options.cooldown_ms);
  d.reason = absl::StrCat(
      "worker ", worker_id, " quarantined until ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S", until, absl::UTCTimeZone()), " UTC after ",
      d.consecutive_failures, " failed generations in a row (last: ", cause, ")");
  d.consecutive_failures = 0;
  d.quarantined_until = until;
  return d;
}

std::optional<std::string> LostAssignment(const AssignmentView& view) {
  if (!view.generation_active || view.joined || view.join_queued) return std::nullopt;
  return absl::StrCat("worker ", view.worker_id, " heartbeats without a job but is a member of ",
                      "job ", view.job_id, " generation ", view.generation,
                      " and has not joined: the answer that carried its JoinJob was lost; "
                      "sending it again");
}

bool JobHasEnded(weft::v1::JobState state) {
  return state == weft::v1::SUCCEEDED || state == weft::v1::FAILED ||
         state == weft::v1::CANCELLED;
}

absl::Status CheckTransition(weft::v1::JobState from, weft::v1::JobState to) {
  auto refuse = [from, to](const char* why) {
    return absl::FailedPreconditionError(absl::StrCat("job state ", JobState_Name(from), " -> ",
                                                      JobState_Name(to), " refused: ", why));
  };
  if (from == to) return refuse("the job is already in that state");
  if (JobHasEnded(from)) return refuse("an ended job never changes state again");
  if (to == weft::v1::CANCELLED) return absl::OkStatus();  // any live job can be cancelled
  switch (from) {
    case weft::v1::PENDING:
      if (to == weft::v1::RUNNING) return absl::OkStatus();
      return refuse("a pending job has no generation: it can only start running or be cancelled");
    case weft::v1::RUNNING:
      if (to == weft::v1::RECOVERING || to == weft::v1::FAILED || to == weft::v1::SUCCEEDED) {
        return absl::OkStatus();
      }
      return refuse("a running job waits for workers only after its generation failed "
                    "(RECOVERING)");
    case weft::v1::RECOVERING:
      if (to == weft::v1::RUNNING || to == weft::v1::PENDING) return absl::OkStatus();
      return refuse("a recovering job has no generation to succeed or fail with");
    default:
      return refuse("the job's current state is not a known job state");
  }
}

}  // namespace weft::coordinator
