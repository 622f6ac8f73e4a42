#include "coordinator/coordinator.h"

#include <algorithm>
#include <atomic>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "common/status_context.h"
#include "common/time_util.h"
#include "spdlog/spdlog.h"

namespace weft::coordinator {

using weft::v1::JobState;

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(
    const CoordinatorOptions& options, std::shared_ptr<prometheus::Registry> registry,
    Clock clock, bool start_ticking) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir: required");
  auto db = StateDb::Open(options.data_dir);
  if (!db.ok()) return db.status();
  if (!clock) clock = [] { return absl::Now(); };

  std::unique_ptr<Coordinator> c(
      new Coordinator(options, std::move(registry), std::move(clock), std::move(*db)));
  Actions actions;
  {
    absl::MutexLock lock(&c->mu_);
    auto running = c->jobs_.Load();
    if (!running.ok()) return running.status();
    absl::flat_hash_set<std::string> kept;
    for (const std::string& id : *running) {
      if (c->KeepGenerationLocked(**c->jobs_.Find(id), actions)) kept.insert(id);
    }
    c->jobs_.DropStoresExcept(kept);
    c->UpdateGaugesLocked();
    spdlog::info("state loaded from {}: {} jobs, next job sequence {}", options.data_dir,
                 c->jobs_.size(), c->jobs_.next_job_seq());
    c->ticking_ = start_ticking;
  }
  if (start_ticking) c->ScheduleTick();
  return c;
}

Coordinator::Coordinator(const CoordinatorOptions& options,
                         std::shared_ptr<prometheus::Registry> registry, Clock clock,
                         std::unique_ptr<StateDb> db)
    : options_(options), registry_(std::move(registry)), clock_(std::move(clock)),
      metrics_(*registry_),
      jobs_(std::move(db), &metrics_, clock_,
            {.max_events_per_job = options.max_events_per_job,
             .metrics_persist_interval_ms = options.metrics_persist_interval_ms}),
      workers_(timer_, &mu_, &metrics_, clock_,
               {.idle_heartbeat_interval_ms = options.heartbeat_interval_ms,
                .idle_heartbeat_timeout_ms = options.heartbeat_timeout_ms,
                .max_idle_heartbeats_per_s = options.max_idle_heartbeats_per_s,
                .quarantine = {.after_failures = options.quarantine_after_failures,
                               .cooldown_ms = options.quarantine_cooldown_ms}}) {}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  shutting_down_ = true;
  if (tick_timer_id_ != 0) timer_.Cancel(tick_timer_id_);
  const absl::Status unavailable = Refusal();
  workers_.Shutdown(unavailable, actions);
  jobs_.ForEachGeneration([&](JobRecord& rec) { rec.generation->Abort(unavailable, actions); });
  jobs_.EndWatches(actions);
  // `actions` runs after the lock is released (declared first, destroyed last).
}

absl::Status Coordinator::Refusal() const {
  return absl::UnavailableError("coordinator shutting down; retry");
}

absl::Time Coordinator::HoldDeadline(absl::Time caller_deadline) const {
  const absl::Time cap = absl::Now() + absl::Milliseconds(options_.max_call_hold_ms);
  if (caller_deadline >= cap) return cap;
  return std::min(cap, caller_deadline - absl::Milliseconds(options_.call_deadline_margin_ms));
}

void Coordinator::ScheduleTick() {
  absl::MutexLock lock(&mu_);
  if (shutting_down_ || !ticking_) return;
  tick_timer_id_ =
      timer_.Schedule(absl::Now() + absl::Milliseconds(options_.tick_interval_ms), [this] {
        Tick();
        ScheduleTick();
      });
}

// ---- generations ---------------------------------------------------------------------------

void Coordinator::StartGenerationLocked(JobRecord& rec, const Placement& placement,
                                        Actions& actions) {
  auto* status = rec.status();
  const int64_t number = status->generation() + 1;
  status->set_generation(number);
  status->clear_worker_ids();
  if (!status->has_start_time()) {
    const absl::Time now = Now();
    ToProtoTime(now, status->mutable_start_time());
    metrics_.SetUncheckpointedSince(status->job_id(), now);
  }
  rec.generation.emplace(
      number, placement.worker_ids,
      [this](const std::string& id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        const weft::v1::WorkerInfo* info = workers_.Info(id);
        return info ? info->host_id() : std::string();
      },
      Now());
  rec.generation->store()->SetJournal(jobs_.StoreJournal(rec.id(), number));
  status->set_rendezvous_complete(false);
  const int32_t world = rec.generation->world_size();
  for (int32_t rank = 0; rank < world; ++rank) {
    const std::string& id = placement.worker_ids[rank];
    status->add_worker_ids(id);
    workers_.Assign(workers_.FindOrAdd(id), rec.job.spec(), status->job_id(), number, rank,
                    world, actions);
  }
  metrics_.CountGenerationStarted();
  jobs_.AddEvent(rec, weft::v1::GENERATION_STARTED,
                 absl::StrCat("generation ", number, " on ", placement.reason, ": ",
                              absl::StrJoin(placement.worker_ids, ", ")));
  jobs_.SetState(rec, weft::v1::RUNNING, absl::StrCat("generation ", number, " assigned"));
  jobs_.Commit(rec, actions);
}

Generation::PeerInfo Coordinator::PeerInfoLocked() {
  return [this](const std::string& id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return workers_.Info(id);
  };
}

void Coordinator::CompleteRendezvousLocked(JobRecord& rec, Actions& actions) {
  Generation& gen = *rec.generation;
  std::vector<MemberView> members;
  for (const std::string& id : gen.members()) {
    const weft::v1::WorkerInfo* info = workers_.Info(id);
    members.push_back({id, info ? info->version() : "", info ? info->checkpointd() : "",
                       gen.DataError(id)});
  }
  if (MemberCheck check = CheckMembers(members, rec.job.spec().checkpoint().interval_steps() > 0);
      !check.refused.empty() || !check.job_error.empty()) {
    return RefuseMembersLocked(rec, check, actions);
  }
  const absl::Duration took = gen.CompleteRendezvous(Now(), PeerInfoLocked(), actions);
  // From here a restarted coordinator keeps the generation (KeepGenerationLocked).
  rec.status()->set_rendezvous_complete(true);
  jobs_.Commit(rec, actions);
  metrics_.ObserveRendezvous(took);
  spdlog::info("job {}: generation {} rendezvous complete: {} ranks in {}", rec.id(),
               gen.number(), gen.world_size(), absl::FormatDuration(took));
}

void Coordinator::EndGenerationLocked(JobRecord& rec, const std::string& reason, bool completed,
                                      Actions& actions) {
  if (!rec.generation) return;
  RecordGenerationEndLocked(rec, reason);
  ReleaseGenerationLocked(rec, reason, completed, actions);
}

void Coordinator::RecordGenerationEndLocked(JobRecord& rec, const std::string& reason) {
  if (!rec.generation) return;
  rec.status()->clear_worker_ids();
  rec.status()->set_rendezvous_complete(false);
  jobs_.AddEvent(rec, weft::v1::GENERATION_ENDED,
                 absl::StrCat("generation ", rec.generation->number(), " ended: ", reason));
}

void Coordinator::ReleaseGenerationLocked(JobRecord& rec, const std::string& reason,
                                          bool completed, Actions& actions) {
  if (!rec.generation) return;
  Generation gen = std::move(*rec.generation);
  rec.generation.reset();
  const std::string& job_id = rec.id();
  for (const std::string& id : gen.members()) {
    if (WorkerRecord* worker = workers_.Find(id)) {
      workers_.Release(*worker, job_id, gen.number(), reason, completed, actions);
    }
  }
  gen.Abort(absl::AbortedError(
                absl::StrCat("generation ", gen.number(), " of job ", job_id, " ended: ", reason)),
            actions);
  // After the Abort: the closed store writes no more keys through.
  jobs_.DropStores(job_id);
}

void Coordinator::FailGenerationLocked(JobRecord& rec, const std::string& cause, bool permanent,
                                       weft::v1::JobEventType event, Actions& actions,
                                       bool spends_restart) {
  if (event != weft::v1::RANK_ERROR) {
    rec.last_rank_error.clear();
    rec.last_rank_error_worker.clear();
  }
  jobs_.AddEvent(rec, event, cause);
  EndGenerationLocked(rec, cause, /*completed=*/false, actions);
  auto* status = rec.status();
  const RecoveryDecision d =
      spends_restart ? DecideAfterFailure(status->restarts(),
                                          rec.job.spec().fault().max_restarts(), permanent, cause)
                     : RecoveryDecision{weft::v1::RECOVERING, false,
                                        absl::StrCat(cause, "; placing the job again")};
  if (d.counts_as_restart) status->set_restarts(status->restarts() + 1);
  if (d.next_state == weft::v1::RECOVERING) metrics_.CountRecovery(status->job_id());
  if (d.next_state == weft::v1::FAILED) status->set_error(d.reason);
  jobs_.SetState(rec, d.next_state, d.reason);
  jobs_.Commit(rec, actions);
}

void Coordinator::RefuseMembersLocked(JobRecord& rec, const MemberCheck& check,
                                      Actions& actions) {
  metrics_.CountFailure("member_refused");
  if (!check.job_error.empty()) {
    return FailGenerationLocked(rec, check.job_error, /*permanent=*/true,
                                weft::v1::MEMBER_REFUSED, actions);
  }
  std::vector<std::string> parts;
  for (const RefusedMember& m : check.refused) {
    const WorkerRecord* w = workers_.Find(m.worker_id);
    rec.refused_members[m.worker_id] = {w ? w->status.incarnation() : 0, m.reason};
    parts.push_back(absl::StrCat(m.worker_id, " ", m.reason));
  }
  const std::string cause = absl::StrCat(
      "generation ", rec.generation->number(), " refused at its rendezvous: ",
      absl::StrJoin(parts, "; "), " (no restart spent; the job is placed again without ",
      check.refused.size() == 1 ? "it" : "them", " until re-registered)");
  spdlog::warn("job {}: {}", rec.id(), cause);
  rec.last_rank_error.clear();
  rec.last_rank_error_worker.clear();
  jobs_.AddEvent(rec, weft::v1::MEMBER_REFUSED, cause);
  EndGenerationLocked(rec, cause, /*completed=*/false, actions);
  jobs_.SetState(rec, weft::v1::RECOVERING, "placing the job again without refused members");
  jobs_.Commit(rec, actions);
  ScheduleLocked(actions);
}

WaitingJobView Coordinator::WaitingViewLocked(const JobRecord& rec) {
  const auto& r = rec.job.spec().resources();
  const auto& sharding = rec.job.spec().sharding();
  WaitingJobView view{rec.id(), r.device_kind(), r.min_workers(), r.max_workers(),
                      sharding.scope() == weft::v1::ShardingSpec::GROUP ? sharding.group_size()
                                                                        : 1};
  for (const auto& [id, refused] : rec.refused_members) {
    const WorkerRecord* w = workers_.Find(id);
    // A worker that re-registered since (restarted, perhaps fixed) is given another chance.
    if (w != nullptr && w->status.incarnation() == refused.first) {
      view.excluded.emplace_back(id, refused.second);
    }
  }
  return view;
}

void Coordinator::BlameWorkerLocked(const std::string& worker_id, JobRecord& rec,
                                    const std::string& cause) {
  if (std::optional<std::string> why = workers_.Blame(worker_id, cause)) {
    spdlog::warn("{}", *why);
    jobs_.AddEvent(rec, weft::v1::WORKER_QUARANTINED, *why);
  }
}

void Coordinator::ScheduleLocked(Actions& actions) {
  const std::vector<JobRecord*> waiting = jobs_.Waiting();
  if (waiting.empty()) return UpdateGaugesLocked();
  std::vector<WaitingJobView> jobs;
  absl::flat_hash_map<std::string, JobRecord*> by_id;
  for (JobRecord* rec : waiting) {
    jobs.push_back(WaitingViewLocked(*rec));
    by_id[rec->id()] = rec;
  }
  // Counts first: most calls (one per registration while a large job gathers its workers)
  // place nothing, and then need no view of every idle worker.
  std::optional<ScheduleDecision> waits = WaitingByCounts(jobs, workers_.IdleByKind());
  std::vector<IdleWorkerView> healthy, quarantined;
  if (!waits) workers_.IdleViews(&healthy, &quarantined);
  const ScheduleDecision decision =
      waits ? *std::move(waits) : ScheduleSparingQuarantined(jobs, healthy, quarantined);
  for (const auto& placement : decision.placements) {
    StartGenerationLocked(*by_id[placement.job_id], placement, actions);
  }
  for (const auto& [job_id, reason] : decision.waiting) {
    JobRecord& rec = *by_id[job_id];
    if (rec.state() == weft::v1::RECOVERING) {
      // Too few workers to form the next generation: the job waits for them (it does not
      // fail), and says so the way a job that never started does.
      rec.status()->set_pending_reason(reason);
      jobs_.SetState(rec, weft::v1::PENDING, absl::StrCat("waiting for workers: ", reason));
      jobs_.Commit(rec, actions);
      continue;
    }
    if (rec.job.status().pending_reason() != reason) {
      rec.status()->set_pending_reason(reason);
      jobs_.NotifyWatchers(rec, actions);
    }
  }
  UpdateGaugesLocked();
}

void Coordinator::UpdateGaugesLocked() {
  metrics_.SetStateCounts(jobs_.CountByState(), workers_.CountByState());
  metrics_.RemoveEndedJobs(Now());
}

// ---- jobs ----------------------------------------------------------------------------------

std::string Coordinator::ResumeProblemLocked(const weft::v1::JobSpec& spec) {
  const std::string& from = spec.resume_from_job();
  if (from.empty()) return "";
  auto other = jobs_.Find(from);
  if (!other.ok()) return absl::StrCat("no job \"", from, "\"");
  const weft::v1::Job& job = (*other)->job;
  // Whether it has a checkpoint is checkpointd's to say, not ours (a job queued to continue a
  // live one is a pipeline; checkpoints may have been written or deleted without us): the
  // restore refuses, as a permanent error, a resume that finds none.
  if (std::string diff = ModelDifference(spec.model(), job.spec().model(), "here",
                                         absl::StrCat("in job ", from));
      !diff.empty()) {
    return absl::StrCat("job ", from, "'s checkpoints are of another model: ", diff);
  }
  return "";
}

absl::StatusOr<weft::v1::SubmitJobResponse> Coordinator::SubmitJob(
    const weft::v1::JobSpec& raw_spec) {
  auto spec = NormalizeJobSpec(raw_spec);
  if (!spec.ok()) return spec.status();
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return Refusal();
  if (std::string problem = ResumeProblemLocked(*spec); !problem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job spec (1 problem):\nresume_from_job: ", problem));
  }
  auto rec = jobs_.Create(*spec);
  if (!rec.ok()) return Annotate(rec.status(), "job not submitted");
  weft::v1::SubmitJobResponse response;
  response.set_job_id((*rec)->id());
  *response.mutable_spec() = *spec;
  ScheduleLocked(actions);
  return response;
}

absl::StatusOr<weft::v1::Job> Coordinator::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto rec = jobs_.Find(job_id);
  if (!rec.ok()) return rec.status();
  weft::v1::Job job = (*rec)->job;
  // Read-time only: stored and streamed statuses would otherwise change (and be written to
  // the state database) on every member's Join of a large rendezvous.
  if (const std::optional<Generation>& gen = (*rec)->generation;
      gen.has_value() && !gen->rendezvous_complete()) {
    for (std::string& id : gen->NotJoined()) job.mutable_status()->add_awaiting_join(std::move(id));
  }
  if (const std::optional<Generation>& gen = (*rec)->generation; gen.has_value()) {
    for (std::string& id : gen->NotReattached()) {
      job.mutable_status()->add_awaiting_reattach(std::move(id));
    }
  }
  return job;
}

absl::StatusOr<weft::v1::ListJobsResponse> Coordinator::ListJobs(
    const weft::v1::ListJobsRequest& request) {
  absl::MutexLock lock(&mu_);
  return jobs_.List(request);
}

absl::StatusOr<weft::v1::JobStatus> Coordinator::CancelJob(const std::string& job_id,
                                                           const std::string& reason) {
  Actions actions;
  absl::MutexLock lock(&mu_);
  auto found = jobs_.Find(job_id);
  if (!found.ok()) return found.status();
  JobRecord& rec = **found;
  if (JobHasEnded(rec.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended: ", JobState_Name(rec.state())));
  }
  const std::string why = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  // Stored before acknowledged, and before the workers hear of it: a cancel that cannot be
  // stored is refused and changes nothing, rather than coming undone at the next restart.
  jobs_.BeginChange(rec);
  jobs_.AddEvent(rec, weft::v1::CANCEL_REQUESTED, why);
  RecordGenerationEndLocked(rec, why);
  jobs_.SetState(rec, weft::v1::CANCELLED, why);
  WEFT_RETURN_IF_ERROR_CONTEXT(jobs_.CommitChange(rec, actions),
                               absl::StrCat("job ", job_id, " not cancelled"));
  ReleaseGenerationLocked(rec, why, /*completed=*/false, actions);
  ScheduleLocked(actions);
  return rec.job.status();
}

absl::StatusOr<weft::v1::GetJobLogsResponse> Coordinator::GetJobLogs(
    const weft::v1::GetJobLogsRequest& request) {
  absl::MutexLock lock(&mu_);
  WEFT_ASSIGN_OR_RETURN(JobRecord* rec, jobs_.Find(request.job_id()));
  WEFT_ASSIGN_OR_RETURN(weft::v1::GetJobLogsResponse response, logs_.Read(request));
  response.set_state(rec->state());
  return response;
}

absl::StatusOr<uint64_t> Coordinator::AddWatcher(const std::string& job_id, Watcher watcher) {
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return Refusal();
  return jobs_.AddWatcher(job_id, std::move(watcher), actions);
}

void Coordinator::RemoveWatcher(uint64_t id) {
  absl::MutexLock lock(&mu_);
  jobs_.RemoveWatcher(id);
}

// ---- workers -------------------------------------------------------------------------------

absl::StatusOr<weft::v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    weft::v1::WorkerInfo info, const std::string& session_token,
    const weft::v1::RunningGeneration* running) {
  if (absl::Status s = WorkerRegistry::CheckRegistration(info, session_token); !s.ok()) return s;
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return Refusal();
  if (absl::Status s = workers_.CheckDeviceClaim(info); !s.ok()) return s;
  const std::string id = info.worker_id();
  WorkerRecord& worker = workers_.FindOrAdd(id);
  const ReattachDecision reattach = ReattachLocked(id, running, actions);
  // A member that attached already and registers again (its answer was lost) stays one.
  const bool same_generation = reattach.attach &&
                               worker.status.job_id() == running->job_id() &&
                               worker.status.generation() == running->generation();
  if (worker.state() == weft::v1::WORKER_BUSY && !same_generation) {
    // The process that held this id is gone: its generation cannot continue.
    auto job = jobs_.Find(worker.status.job_id());
    if (job.ok() && (*job)->ActiveGeneration(worker.status.generation()) != nullptr) {
      metrics_.CountFailure("reregistered");
      workers_.MarkDead(worker, "re-registered by a new process");
      FailGenerationLocked(**job,
                           absl::StrCat("worker ", id, " re-registered (its previous process, "
                                        "rank ", worker.status.rank(), ", is gone)"),
                           /*permanent=*/false, weft::v1::WORKER_LOST, actions);
    }
  }
  workers_.Register(worker, std::move(info), session_token, actions);
  weft::v1::RegisterWorkerResponse response;
  if (reattach.attach) {
    AttachLocked(worker, *running, actions);
    response.set_reattached(true);
  } else if (running != nullptr) {
    spdlog::info("worker {} drops {}", id, reattach.reason);
    response.set_reattach_refusal(reattach.reason);
  }
  ScheduleLocked(actions);
  response.set_worker_id(id);
  response.set_incarnation(worker.status.incarnation());
  response.set_heartbeat_interval_ms(workers_.HeartbeatInterval(worker));
  return response;
}

void Coordinator::Heartbeat(const weft::v1::HeartbeatRequest& request, absl::Time deadline,
                            Done<weft::v1::HeartbeatResponse> done) {
  metrics_.CountHeartbeat();
  Actions actions;
  absl::MutexLock lock(&mu_);
  auto answer = [&actions, &done](absl::StatusOr<weft::v1::HeartbeatResponse> r) {
    actions.Add([done, r = std::move(r)] { done(r); });
  };
  if (shutting_down_) return answer(Refusal());
  WorkerRecord* worker = workers_.Find(request.worker_id());
  if (worker == nullptr || request.incarnation() > worker->status.incarnation()) {
    // The coordinator does not know this process (e.g. it restarted): register again.
    return answer(absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " incarnation ", request.incarnation(),
                     " is not registered; register again")));
  }
  if (request.incarnation() < worker->status.incarnation()) {
    // Another process registered under this id since: this one must go away, not register
    // again (the two would keep displacing each other).
    return answer(WorkerRegistry::StopResponse(request.worker_id(), request.incarnation(),
                                               worker->status.incarnation()));
  }
  logs_.Append(request, [&](const std::string& job_id) { return jobs_.Contains(job_id); });
  if (workers_.Beat(*worker, request)) ScheduleLocked(actions);
  if (request.job_id().empty()) ResendLostAssignmentLocked(*worker, actions);
  workers_.Hold(*worker, request.wait_for_command_ms(), deadline, std::move(done), actions);
}

void Coordinator::ResendLostAssignmentLocked(WorkerRecord& worker, Actions& actions) {
  if (worker.state() != weft::v1::WORKER_BUSY || worker.status.job_id().empty()) return;
  const std::string& job_id = worker.status.job_id();
  const int64_t number = worker.status.generation();
  auto found = jobs_.Find(job_id);
  if (!found.ok()) return;
  JobRecord& rec = **found;
  const Generation* gen = rec.ActiveGeneration(number);
  const std::optional<std::string> lost =
      LostAssignment({.worker_id = worker.id(),
                      .job_id = job_id,
                      .generation = number,
                      .generation_active = gen != nullptr,
                      .joined = gen != nullptr && gen->HasJoined(worker.id()),
                      .join_queued = WorkerRegistry::HasPendingJoin(worker, job_id, number)});
  if (!lost) return;
  spdlog::warn("job {}: {}", job_id, *lost);
  metrics_.CountAssignmentResent();
  workers_.Assign(worker, rec.job.spec(), job_id, number, gen->RankOf(worker.id()),
                  gen->world_size(), actions);
}

absl::StatusOr<uint64_t> Coordinator::OpenSession(const std::string& token, SessionEnd end) {
  if (absl::Status s = WorkerRegistry::CheckSessionToken(token); !s.ok()) return s;
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return Refusal();
  return workers_.OpenSession(token, std::move(end), actions);
}

void Coordinator::SessionClosed(const std::string& token, uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  workers_.CloseSession(token, session_id);
}

absl::StatusOr<weft::v1::ListWorkersResponse> Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  return workers_.List();
}

// ---- rendezvous ----------------------------------------------------------------------------

void Coordinator::Join(const weft::v1::JoinRequest& request, absl::Time deadline,
                       Done<weft::v1::JoinResponse> done) {
  Actions actions;
  absl::MutexLock lock(&mu_);
  auto fail = [&actions, &done](absl::Status s) { actions.Add([done, s] { done(s); }); };
  if (shutting_down_) return fail(Refusal());
  auto found = jobs_.Find(request.job_id());
  if (!found.ok()) return fail(found.status());
  JobRecord& rec = **found;
  const int64_t current = rec.job.status().generation();
  Generation* gen = rec.ActiveGeneration(request.generation());
  if (gen == nullptr) {
    if (request.generation() >= 1 && request.generation() <= current) {
      return fail(absl::AbortedError(absl::StrCat(
          "generation ", request.generation(), " of job ", request.job_id(),
          " has ended (job is ", JobState_Name(rec.state()), ")")));
    }
    return fail(absl::NotFoundError(absl::StrCat("job ", request.job_id(), " has no generation ",
                                                 request.generation(), " (current: ", current,
                                                 ")")));
  }
  const int32_t rank = gen->RankOf(request.worker_id());
  if (rank < 0) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not a member of generation ",
                     gen->number(), " of job ", request.job_id())));
  }
  const WorkerRecord* w = workers_.Find(request.worker_id());
  if (w == nullptr || w->status.incarnation() != request.incarnation()) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "worker ", request.worker_id(), " incarnation ", request.incarnation(), " is stale")));
  }
  const bool all_joined = gen->MarkJoined(request.worker_id(), request.data_error());
  if (gen->rendezvous_complete()) {
    actions.Add([done, response = gen->ResponseFor(rank, request.include_peers(),
                                                   PeerInfoLocked())] { done(response); });
    return;
  }
  gen->ParkJoin(
      request.worker_id(), request.include_peers(), timer_, &mu_, deadline, std::move(done),
      [this, job_id = request.job_id(), worker_id = request.worker_id(), number = gen->number()](
          const Generation::JoinCall& call) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        // Runs under mu_ (the call's guard); a generation that ended took its joins with it.
        auto j = jobs_.Find(job_id);
        Generation* g = j.ok() ? (*j)->ActiveGeneration(number) : nullptr;
        if (g == nullptr) return absl::DeadlineExceededError("rendezvous deadline passed");
        return g->ExpireJoin(worker_id, call);
      },
      actions);
  if (all_joined) CompleteRendezvousLocked(rec, actions);
}

// ---- liveness ------------------------------------------------------------------------------

void Coordinator::Tick() {
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  // Heartbeat ages are a gauge per worker, scraped every few seconds: refreshing them once
  // a second is enough, and at 10K workers every tick (10 a second) cost a tenth of a core.
  const bool refresh_ages = Now() >= next_age_refresh_;
  if (refresh_ages) next_age_refresh_ = Now() + absl::Seconds(1);
  const std::vector<WorkerLivenessView> workers = workers_.LivenessViews(refresh_ages);
  std::vector<GenerationView> generations;
  jobs_.ForEachGeneration(
      [&](JobRecord& rec) { generations.push_back(rec.generation->View(rec.id(), rec.job)); });
  LivenessOptions liveness;
  liveness.idle_heartbeat_timeout_ms = workers_.IdleHeartbeatNow().timeout_ms;
  liveness.rendezvous_timeout_ms = options_.rendezvous_timeout_ms;
  liveness.connection_lost_grace_ms = options_.connection_lost_grace_ms;
  workers_.DropStaleSessions();
  // Changes no caller waited on whose write failed (a full disk) are written again, so that
  // the state database catches up with memory as soon as it can.
  jobs_.RetryUnpersisted();
  ApplyFailuresLocked(CheckLiveness(Now(), workers, generations, liveness), actions);
  ScheduleLocked(actions);
}

void Coordinator::ApplyFailuresLocked(const std::vector<Failure>& failures, Actions& actions) {
  for (const Failure& f : failures) {
    metrics_.CountFailure(FailureKindLabel(f.kind));
    if (IsWorkerDeath(f.kind)) {
      workers_.MarkDead(workers_.FindOrAdd(f.worker_id), f.reason);
      spdlog::warn("{}", f.reason);
    }
    if (f.job_id.empty()) continue;
    auto job = jobs_.Find(f.job_id);
    // A generation already ended by an earlier failure of this tick is not ended twice.
    if (!job.ok() || (*job)->ActiveGeneration(f.generation) == nullptr) continue;
    const weft::v1::JobEventType event =
        f.kind == FailureKind::kHeartbeatTimeout || f.kind == FailureKind::kReattachTimeout
            ? weft::v1::WORKER_LOST
        : f.kind == FailureKind::kConnectionLost ? weft::v1::CONNECTION_LOST
                                                 : weft::v1::GENERATION_ENDED;
    // A kept generation whose members did not all come back (a restart of the whole cluster,
    // or members that died while the coordinator was away) is not the job's failure either.
    FailGenerationLocked(**job, f.reason, /*permanent=*/false, event, actions,
                         /*spends_restart=*/f.kind != FailureKind::kReattachTimeout);
    if (!f.worker_id.empty()) BlameWorkerLocked(f.worker_id, **job, f.reason);
  }
}

}  // namespace weft::coordinator
