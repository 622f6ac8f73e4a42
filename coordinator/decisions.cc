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

std::string QueuedBehind(const std::string& job_id) {
  return absl::StrCat("queued behind job ", job_id, " (first come, first served)");
}

// Why `job` waits for workers: `usable` of its kind are idle and free for it; `excluded` more
// were refused by it and `shared_gpu` more drive a GPU another candidate drives.
std::string TooFewReason(const WaitingJobView& job, size_t usable, size_t excluded,
                         size_t shared_gpu) {
  std::string reason = absl::StrCat("needs ", job.min_workers, " idle ", KindName(job.device_kind),
                                    " worker", job.min_workers == 1 ? "" : "s", ", ",
                                    usable + excluded + shared_gpu, " idle");
  if (shared_gpu > 0) {
    absl::StrAppend(&reason, ", ", shared_gpu, " of them sharing a GPU with another");
  }
  if (excluded > 0) {
    std::vector<std::string> why;
    for (const auto& [id, r] : job.excluded) why.push_back(absl::StrCat(id, ": ", r));
    absl::StrAppend(&reason, ", ", excluded, " of them refused by this job (",
                    absl::StrJoin(why, "; "), ")");
  }
  return reason;
}

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
          job.job_id, QueuedBehind(it->second));
      continue;
    }
    if (count < static_cast<size_t>(std::max(job.min_workers, 0))) {
      plan.waiting.emplace_back(job.job_id, TooFewReason(job, count, 0, 0));
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

namespace {

// The workers `job` may take from `pool` (placement order), skipping those already taken
// (`used`), those excluded from the job and those whose GPU an earlier candidate drives;
// counts what it skipped for the waiting reason.
struct Candidates {
  std::vector<size_t> indices;  // into the pool, placement order
  size_t excluded = 0;
  size_t shared_gpu = 0;
};

Candidates CandidatesFor(const WaitingJobView& job, const std::vector<IdleWorkerView>& pool,
                         const std::vector<bool>& used) {
  Candidates c;
  absl::flat_hash_set<std::string_view> excluded;
  for (const auto& [id, why] : job.excluded) excluded.insert(id);
  absl::flat_hash_set<std::string_view> gpus;
  for (size_t i = 0; i < pool.size(); ++i) {
    if (used[i]) continue;
    const IdleWorkerView& w = pool[i];
    if (excluded.contains(w.worker_id)) {
      ++c.excluded;
    } else if (!w.gpu_uuid.empty() && !gpus.insert(w.gpu_uuid).second) {
      ++c.shared_gpu;
    } else {
      c.indices.push_back(i);
    }
  }
  return c;
}

std::string PlacedReason(const WaitingJobView& job, size_t take, size_t hosts) {
  return absl::StrCat(take, " idle ", KindName(job.device_kind), " worker", take == 1 ? "" : "s",
                      " on ", hosts, " host", hosts == 1 ? "" : "s", " (min ", job.min_workers,
                      ", max ", job.max_workers,
                      job.world_multiple > 1
                          ? absl::StrCat(", a multiple of the group size ", job.world_multiple)
                          : "",
                      ")");
}

}  // namespace

ScheduleDecision Schedule(const std::vector<WaitingJobView>& jobs,
                          const std::vector<IdleWorkerView>& idle_workers) {
  ScheduleDecision decision;
  // First decide by counts alone; only the kinds that may place a job pay for sorting workers.
  IdleCounts available;
  for (const auto& w : idle_workers) ++available[w.device_kind];
  CountPlan plan = PlanByCounts(jobs, std::move(available));
  if (plan.placed.empty()) {
    decision.waiting = std::move(plan.waiting);
    return decision;
  }

  // Counts overstate what a job can take when workers share a GPU or were refused by it, so
  // the placing pass goes over the jobs again, in queue order, with the workers themselves.
  std::map<weft::v1::DeviceKind, std::vector<IdleWorkerView>> pool;
  for (const auto& [job, take] : plan.placed) pool[job->device_kind];
  for (const auto& w : idle_workers) {
    if (auto it = pool.find(w.device_kind); it != pool.end()) it->second.push_back(w);
  }
  std::map<weft::v1::DeviceKind, std::vector<bool>> used;
  for (auto& [kind, workers] : pool) {
    SortInPlacementOrder(&workers);
    used[kind].assign(workers.size(), false);
  }
  absl::flat_hash_map<std::string_view, std::string_view> counted_wait;
  for (const auto& [id, reason] : plan.waiting) counted_wait[id] = reason;
  absl::flat_hash_map<weft::v1::DeviceKind, std::string> blocked_by;
  for (const auto& job : jobs) {
    auto p = pool.find(job.device_kind);
    if (p == pool.end()) {  // no job of this kind could be placed even by counts
      decision.waiting.emplace_back(job.job_id, std::string(counted_wait[job.job_id]));
      continue;
    }
    if (auto it = blocked_by.find(job.device_kind); it != blocked_by.end()) {
      decision.waiting.emplace_back(
          job.job_id, QueuedBehind(it->second));
      continue;
    }
    const Candidates c = CandidatesFor(job, p->second, used[job.device_kind]);
    if (c.indices.size() < static_cast<size_t>(std::max(job.min_workers, 0))) {
      decision.waiting.emplace_back(
          job.job_id, TooFewReason(job, c.indices.size(), c.excluded, c.shared_gpu));
      blocked_by[job.device_kind] = job.job_id;
      continue;
    }
    size_t take = std::min<size_t>(c.indices.size(), std::max(job.max_workers, job.min_workers));
    take -= take % static_cast<size_t>(std::max(job.world_multiple, 1));
    std::vector<IdleWorkerView> taken;
    for (size_t k = 0; k < take; ++k) {
      used[job.device_kind][c.indices[k]] = true;
      taken.push_back(p->second[c.indices[k]]);
    }
    SortInRankOrder(&taken);
    Placement placement;
    placement.job_id = job.job_id;
    absl::flat_hash_set<std::string_view> hosts;
    for (const auto& w : taken) {
      placement.worker_ids.emplace_back(w.worker_id);
      hosts.insert(w.host_id);
    }
    placement.reason = PlacedReason(job, take, hosts.size());
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
    if (!g.not_reattached.empty() && now > g.reattach_deadline) {
      failures.push_back({FailureKind::kReattachTimeout, "", g.job_id, g.generation,
                          absl::StrCat("generation ", g.generation, " kept over the ",
                                       "coordinator's restart: not every member attached to it ",
                                       "again in time (their processes died meanwhile?); ",
                                       "missing: ", absl::StrJoin(g.not_reattached, ", "))});
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

MemberCheck CheckMembers(const std::vector<MemberView>& members, bool checkpoints) {
  MemberCheck check;
  if (members.empty()) return check;
  absl::flat_hash_map<std::string, std::string> refused;  // worker -> reasons so far
  auto refuse = [&refused](const std::string& worker, const std::string& why) {
    std::string& r = refused[worker];
    absl::StrAppend(&r, r.empty() ? "" : "; ", why);
  };

  size_t unreadable = 0;
  for (const auto& m : members) unreadable += !m.data_error.empty();
  if (unreadable == members.size()) {
    check.job_error = absl::StrCat("no member can read the job's data: ", members[0].data_error);
    return check;
  }
  for (const auto& m : members) {
    if (!m.data_error.empty()) refuse(m.worker_id, absl::StrCat("cannot read its data (", m.data_error, ") while its peers can"));
  }

  // The most common release; ties go to the lowest rank's.
  absl::flat_hash_map<std::string, size_t> releases;
  for (const auto& m : members) ++releases[m.version];
  const std::string* common = &members[0].version;
  for (const auto& m : members) {
    if (releases[m.version] > releases[*common]) common = &m.version;
  }
  for (const auto& m : members) {
    if (m.version != *common) {
      refuse(m.worker_id, absl::StrCat("runs weft-worker ", m.version.empty() ? "(unknown)" : m.version,
                                       " while its peers run ", *common));
    }
  }

  if (checkpoints) {
    const auto with = std::find_if(members.begin(), members.end(),
                                   [](const MemberView& m) { return !m.checkpointd.empty(); });
    if (with != members.end()) {
      for (const auto& m : members) {
        if (m.checkpointd.empty()) {
          refuse(m.worker_id, absl::StrCat("has no checkpointd (--checkpointd or WEFT_CHECKPOINTD) "
                                           "while ", with->worker_id, " saves to ", with->checkpointd,
                                           " and the job checkpoints"));
        }
      }
    }
  }
  for (const auto& m : members) {
    if (auto it = refused.find(m.worker_id); it != refused.end()) {
      check.refused.push_back({m.worker_id, it->second});
    }
  }
  return check;
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

ReattachDecision DecideReattach(const std::string& worker_id, const std::string& job_id,
                                int64_t generation, int32_t rank, const ReattachView& view) {
  const std::string what = absl::StrCat("generation ", generation, " of job ", job_id);
  if (!view.job_found) {
    return {false, absl::StrCat(what, ": the coordinator has no such job")};
  }
  if (view.state != weft::v1::RUNNING) {
    return {false, absl::StrCat(what, ": the job is ", weft::v1::JobState_Name(view.state))};
  }
  if (view.active_generation != generation) {
    return {false, absl::StrCat(what, " has ended",
                                view.active_generation > 0
                                    ? absl::StrCat(" (the job runs generation ",
                                                   view.active_generation, ")")
                                    : " (the job forms a new generation)")};
  }
  if (view.member_rank != rank) {
    return {false, absl::StrCat("worker ", worker_id, " is not rank ", rank, " of ", what,
                                view.member_rank >= 0
                                    ? absl::StrCat(" (it is rank ", view.member_rank, ")")
                                    : " (it is not a member)")};
  }
  return {true, ""};
}

int64_t ReattachWindowMs(int64_t heartbeat_timeout_ms, int64_t floor_ms) {
  return std::max(heartbeat_timeout_ms, floor_ms);
}

}  // namespace weft::coordinator
