#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/metrics.h"
#include "common/time_util.h"
#include "spdlog/spdlog.h"

namespace weft::coordinator {

using weft::v1::Command;
using weft::v1::Job;
using weft::v1::JobEventType;
using weft::v1::JobSpec;
using weft::v1::JobState;
using weft::v1::JobStatus;
using weft::v1::WorkerState;

namespace {

constexpr JobState kAllJobStates[] = {weft::v1::PENDING,   weft::v1::RUNNING,
                                      weft::v1::RECOVERING, weft::v1::SUCCEEDED,
                                      weft::v1::FAILED,    weft::v1::CANCELLED};
constexpr WorkerState kAllWorkerStates[] = {weft::v1::WORKER_IDLE, weft::v1::WORKER_BUSY,
                                            weft::v1::WORKER_DEAD};

bool ValidWorkerId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '/' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string DeviceName(const weft::v1::WorkerInfo& info) {
  return absl::StrCat(info.device_kind() == weft::v1::DEVICE_KIND_CUDA ? "cuda" : "cpu",
                      info.device_index());
}

int64_t SeqFromJobId(const std::string& job_id) {
  int64_t seq = 0;
  const size_t dash = job_id.rfind('-');
  if (dash != std::string::npos) (void)absl::SimpleAtoi(job_id.substr(dash + 1), &seq);
  return seq;
}

std::string FailureKindLabel(FailureKind kind) {
  switch (kind) {
    case FailureKind::kHeartbeatTimeout:
      return "heartbeat_timeout";
    case FailureKind::kRendezvousTimeout:
      return "rendezvous_timeout";
    case FailureKind::kStall:
      return "stall";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(
    const CoordinatorOptions& options, std::shared_ptr<prometheus::Registry> registry,
    Clock clock, bool start_ticking) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir: required");
  auto db = StateDb::Open(options.data_dir);
  if (!db.ok()) return db.status();
  auto jobs = (*db)->LoadJobs();
  if (!jobs.ok()) return jobs.status();
  auto seq = (*db)->LoadNextJobSeq();
  if (!seq.ok()) return seq.status();
  if (!clock) clock = [] { return absl::Now(); };

  std::unique_ptr<Coordinator> c(
      new Coordinator(options, std::move(registry), std::move(clock), std::move(*db)));
  Actions actions;
  {
    absl::MutexLock lock(&c->mu_);
    c->next_job_seq_ = *seq;
    for (Job& job : *jobs) {
      const std::string id = job.status().job_id();
      JobRecord& rec = c->jobs_[id];
      rec.job = std::move(job);
      rec.seq = SeqFromJobId(id);
      rec.last_persist = c->Now();
      if (rec.job.status().state() == weft::v1::RUNNING) {
        // Its workers were attached to the previous process; they re-register and the job
        // forms a new generation. Not the job's fault, so no restart is used.
        c->SetStateLocked(rec, weft::v1::RECOVERING,
                          absl::StrCat("coordinator restarted; generation ",
                                       rec.job.status().generation(), " abandoned"),
                          actions);
        rec.job.mutable_status()->clear_worker_ids();
        c->CommitLocked(rec, actions);
      }
    }
    c->UpdateGaugesLocked();
    spdlog::info("state loaded from {}: {} jobs, next job sequence {}", options.data_dir,
                 c->jobs_.size(), c->next_job_seq_);
    c->ticking_ = start_ticking;
  }
  if (start_ticking) c->ScheduleTick();
  return c;
}

Coordinator::Coordinator(const CoordinatorOptions& options,
                         std::shared_ptr<prometheus::Registry> registry, Clock clock,
                         std::unique_ptr<StateDb> db)
    : options_(options), registry_(std::move(registry)), clock_(std::move(clock)),
      db_(std::move(db)) {
  jobs_gauge_ = &prometheus::BuildGauge()
                     .Name("weft_coordinator_jobs")
                     .Help("Jobs by state")
                     .Register(*registry_);
  for (JobState s : kAllJobStates) jobs_gauge_->Add({{"state", JobState_Name(s)}});
  workers_gauge_ = &prometheus::BuildGauge()
                        .Name("weft_coordinator_workers")
                        .Help("Registered workers by state")
                        .Register(*registry_);
  for (WorkerState s : kAllWorkerStates) workers_gauge_->Add({{"state", WorkerState_Name(s)}});
  heartbeats_ = &AddCounter(*registry_, "weft_coordinator_heartbeats_total", "Heartbeats received");
  jobs_submitted_ = &AddCounter(*registry_, "weft_coordinator_jobs_submitted_total",
                                "Jobs accepted by SubmitJob");
  rendezvous_latency_ = &AddHistogram(*registry_, "weft_coordinator_rendezvous_latency_seconds",
                                      "From a generation's assignment to its last member joining",
                                      ExponentialBuckets(0.001, 2.0, 18));
  failures_ = &prometheus::BuildCounter()
                   .Name("weft_coordinator_failures_detected_total")
                   .Help("Failures that ended a generation or marked a worker dead, by kind")
                   .Register(*registry_);
  for (const char* kind : {"heartbeat_timeout", "rendezvous_timeout", "stall", "rank_error",
                           "reregistered"}) {
    failures_->Add({{"kind", kind}});
  }
  generations_started_ = &AddCounter(*registry_, "weft_coordinator_generations_started_total",
                                     "Job generations formed (first starts and restarts)");
  recoveries_ = &prometheus::BuildCounter()
                     .Name("weft_coordinator_recoveries_total")
                     .Help("Generation failures a job recovers from (it goes RECOVERING), by job")
                     .Register(*registry_);
  job_events_ = &prometheus::BuildCounter()
                     .Name("weft_coordinator_job_events_total")
                     .Help("Job events (trainctl events), by job and type")
                     .Register(*registry_);
  heartbeat_age_ = &prometheus::BuildGauge()
                        .Name("weft_coordinator_worker_heartbeat_age_seconds")
                        .Help("Time since each live worker's last heartbeat")
                        .Register(*registry_);
  auto job_gauge = [this](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  };
  job_gauges_ = {
      job_gauge("weft_coordinator_job_step", "Last step rank 0 reported"),
      job_gauge("weft_coordinator_job_loss", "Training loss rank 0 reported last"),
      job_gauge("weft_coordinator_job_tokens_per_second", "Tokens per second of the whole job"),
      job_gauge("weft_coordinator_job_mfu_ratio", "Model FLOPs utilisation per rank (0-1)"),
      job_gauge("weft_coordinator_job_step_seconds", "Wall time of the last step"),
      job_gauge("weft_coordinator_job_checkpoint_stall_seconds",
                "Training time the last committed checkpoint's snapshot took"),
      job_gauge("weft_coordinator_job_checkpoint_save_seconds",
                "Upload-to-commit time of the last committed checkpoint"),
  };
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  shutting_down_ = true;
  if (tick_timer_id_ != 0) timer_.Cancel(tick_timer_id_);
  const absl::Status unavailable = absl::UnavailableError("coordinator shutting down; retry");
  for (auto& [id, worker] : workers_) {
    if (worker.parked) {
      timer_.Cancel(worker.parked->timer_id);
      actions.Add([done = std::move(worker.parked->done), unavailable] { done(unavailable); });
      worker.parked.reset();
    }
  }
  for (auto& [token, session] : sessions_) {
    if (session.end) actions.Add([end = std::move(session.end), unavailable] { end(unavailable); });
    session.end = nullptr;
  }
  for (auto& [id, rec] : jobs_) {
    if (!rec.generation) continue;
    for (auto& [w, waiter] : rec.generation->join_waiters) {
      timer_.Cancel(waiter.timer_id);
      actions.Add([done = std::move(waiter.done), unavailable] { done(unavailable); });
    }
    rec.generation->join_waiters.clear();
    actions.Add([store = rec.generation->store, unavailable] { store->Close(unavailable); });
  }
  for (auto& [id, watcher] : watchers_) {
    auto it = jobs_.find(watcher.job_id);
    if (it == jobs_.end()) continue;
    actions.Add([fn = std::move(watcher.fn), status = it->second.job.status()] {
      fn(status, UINT64_MAX, true);
    });
  }
  watchers_.clear();
  // `actions` runs after the lock is released (declared first, destroyed last).
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

bool Coordinator::IsTerminal(JobState state) const {
  return state == weft::v1::SUCCEEDED || state == weft::v1::FAILED ||
         state == weft::v1::CANCELLED;
}

// ---- helpers -------------------------------------------------------------------------------

void Coordinator::AddEventLocked(JobRecord& rec, JobEventType type, const std::string& message,
                                 Actions& actions) {
  auto* status = rec.job.mutable_status();
  auto* event = status->add_events();
  ToProtoTime(Now(), event->mutable_time());
  event->set_type(type);
  event->set_generation(status->generation());
  event->set_state(status->state());
  event->set_message(message);
  job_events_->Add({{"job_id", status->job_id()}, {"type", JobEventType_Name(type)}}).Increment();
  if (status->events_size() > options_.max_events_per_job) {
    status->mutable_events()->DeleteSubrange(
        0, status->events_size() - options_.max_events_per_job);
  }
  spdlog::info("job {}: {}: {}", status->job_id(), weft::v1::JobEventType_Name(type), message);
}

void Coordinator::SetStateLocked(JobRecord& rec, JobState state, const std::string& reason,
                                 Actions& actions) {
  auto* status = rec.job.mutable_status();
  if (status->state() == state) return;
  status->set_state(state);
  if (IsTerminal(state)) ToProtoTime(Now(), status->mutable_end_time());
  if (state != weft::v1::PENDING && state != weft::v1::RECOVERING) status->clear_pending_reason();
  AddEventLocked(rec, weft::v1::STATE_CHANGED, absl::StrCat(JobState_Name(state), ": ", reason),
                 actions);
}

void Coordinator::CommitLocked(JobRecord& rec, Actions& actions) {
  if (absl::Status s = db_->PutJob(rec.job); !s.ok()) {
    // The in-memory state stays authoritative; the next commit retries the write.
    spdlog::error("job {}: {}", rec.job.status().job_id(), std::string(s.message()));
  } else {
    rec.last_persist = Now();
  }
  NotifyWatchersLocked(rec, actions);
}

void Coordinator::NotifyWatchersLocked(const JobRecord& rec, Actions& actions) {
  const std::string& job_id = rec.job.status().job_id();
  const bool final = IsTerminal(rec.job.status().state());
  const uint64_t seq = ++update_seq_;
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (it->second.job_id != job_id) {
      ++it;
      continue;
    }
    actions.Add([fn = it->second.fn, status = rec.job.status(), seq, final] {
      fn(status, seq, final);
    });
    it = final ? watchers_.erase(it) : std::next(it);
  }
}

int64_t Coordinator::HeartbeatIntervalLocked(const WorkerRecord& worker) {
  if (worker.status.state() == weft::v1::WORKER_BUSY) {
    auto it = jobs_.find(worker.status.job_id());
    if (it != jobs_.end()) return it->second.job.spec().fault().heartbeat_interval_ms();
  }
  return options_.heartbeat_interval_ms;
}

weft::v1::HeartbeatResponse Coordinator::StopResponse(const std::string& worker_id,
                                                      int64_t stale, int64_t current) {
  weft::v1::HeartbeatResponse response;
  response.add_commands()->mutable_stop()->set_reason(
      absl::StrCat("worker id ", worker_id, " was registered again by another process "
                   "(incarnation ", current, "); incarnation ", stale, " must stop"));
  return response;
}

weft::v1::HeartbeatResponse Coordinator::TakeCommandsLocked(WorkerRecord& worker,
                                                            int64_t interval_ms) {
  weft::v1::HeartbeatResponse response;
  for (auto& c : worker.pending) *response.add_commands() = std::move(c);
  worker.pending.clear();
  response.set_heartbeat_interval_ms(interval_ms);
  return response;
}

void Coordinator::FlushHeartbeatLocked(WorkerRecord& worker, Actions& actions) {
  if (!worker.parked) return;
  timer_.Cancel(worker.parked->timer_id);
  auto response = TakeCommandsLocked(worker, HeartbeatIntervalLocked(worker));
  actions.Add([done = std::move(worker.parked->done), response = std::move(response)] {
    done(response);
  });
  worker.parked.reset();
}

void Coordinator::EnqueueCommandLocked(WorkerRecord& worker, Command command, Actions& actions) {
  worker.pending.push_back(std::move(command));
  FlushHeartbeatLocked(worker, actions);
}

// ---- generations ---------------------------------------------------------------------------

void Coordinator::StartGenerationLocked(JobRecord& rec, const Placement& placement,
                                        Actions& actions) {
  auto* status = rec.job.mutable_status();
  const int64_t number = status->generation() + 1;
  status->set_generation(number);
  status->clear_worker_ids();
  if (!status->has_start_time()) ToProtoTime(Now(), status->mutable_start_time());

  Generation gen;
  gen.number = number;
  gen.members = placement.worker_ids;
  gen.start_time = Now();
  gen.last_progress_time = gen.start_time;
  gen.store = std::make_shared<MemoryStore>();
  const int32_t world = static_cast<int32_t>(gen.members.size());
  absl::flat_hash_map<std::string, int32_t> per_host;
  gen.local_rank.resize(world);
  gen.local_world_size.resize(world);
  for (int32_t rank = 0; rank < world; ++rank) {
    gen.rank_of[gen.members[rank]] = rank;
    gen.local_rank[rank] = per_host[workers_[gen.members[rank]].status.info().host()]++;
  }
  for (int32_t rank = 0; rank < world; ++rank) {
    gen.local_world_size[rank] = per_host[workers_[gen.members[rank]].status.info().host()];
  }
  for (int32_t rank = 0; rank < world; ++rank) {
    const std::string& id = gen.members[rank];
    status->add_worker_ids(id);
    WorkerRecord& worker = workers_[id];
    worker.status.set_state(weft::v1::WORKER_BUSY);
    worker.status.set_job_id(status->job_id());
    worker.status.set_generation(number);
    worker.status.set_rank(rank);
    worker.status.set_reason(absl::StrCat("rank ", rank, " of job ", status->job_id(),
                                          " generation ", number));
    Command command;
    auto* join = command.mutable_join_job();
    join->set_job_id(status->job_id());
    join->set_generation(number);
    *join->mutable_spec() = rec.job.spec();
    join->set_rank(rank);
    join->set_world_size(world);
    EnqueueCommandLocked(worker, std::move(command), actions);
  }
  rec.generation = std::move(gen);
  generations_started_->Increment();
  AddEventLocked(rec, weft::v1::GENERATION_STARTED,
                 absl::StrCat("generation ", number, " on ", placement.reason, ": ",
                              absl::StrJoin(placement.worker_ids, ", ")),
                 actions);
  SetStateLocked(rec, weft::v1::RUNNING, absl::StrCat("generation ", number, " assigned"),
                 actions);
  CommitLocked(rec, actions);
}

weft::v1::JoinResponse Coordinator::JoinResponseFor(const JobRecord& rec, int32_t rank,
                                                    bool include_peers) {
  const Generation& gen = *rec.generation;
  weft::v1::JoinResponse response;
  response.set_rank(rank);
  response.set_world_size(static_cast<int32_t>(gen.members.size()));
  response.set_local_rank(gen.local_rank[rank]);
  response.set_local_world_size(gen.local_world_size[rank]);
  if (!include_peers) return response;
  for (size_t r = 0; r < gen.members.size(); ++r) {
    auto* peer = response.add_peers();
    peer->set_rank(static_cast<int32_t>(r));
    peer->set_worker_id(gen.members[r]);
    if (auto it = workers_.find(gen.members[r]); it != workers_.end()) {
      const auto& info = it->second.status.info();
      peer->set_host(info.host());
      peer->set_device_index(info.device_index());
      peer->set_address(info.address());
    }
  }
  return response;
}

void Coordinator::CompleteRendezvousLocked(JobRecord& rec, Actions& actions) {
  Generation& gen = *rec.generation;
  gen.rendezvous_complete = true;
  gen.last_progress_time = Now();
  const absl::Duration took = Now() - gen.start_time;
  rendezvous_latency_->Observe(absl::ToDoubleSeconds(took));
  for (auto& [worker_id, waiter] : gen.join_waiters) {
    timer_.Cancel(waiter.timer_id);
    actions.Add([done = std::move(waiter.done),
                 response = JoinResponseFor(rec, gen.rank_of.at(worker_id), waiter.include_peers)] {
      done(response);
    });
  }
  gen.join_waiters.clear();
  spdlog::info("job {}: generation {} rendezvous complete: {} ranks in {}",
               rec.job.status().job_id(), gen.number, gen.members.size(),
               absl::FormatDuration(took));
}

void Coordinator::EndGenerationLocked(JobRecord& rec, const std::string& reason, bool completed,
                                      Actions& actions) {
  if (!rec.generation) return;
  Generation gen = std::move(*rec.generation);
  rec.generation.reset();
  const std::string& job_id = rec.job.status().job_id();
  for (const std::string& id : gen.members) {
    auto it = workers_.find(id);
    if (it == workers_.end()) continue;
    WorkerRecord& worker = it->second;
    if (worker.status.job_id() != job_id || worker.status.generation() != gen.number) continue;
    worker.status.clear_job_id();
    worker.status.clear_generation();
    worker.status.clear_rank();
    // A member that has not fetched its JoinJob yet must never see it: withdraw it, and then
    // there is nothing for it to abort either.
    const size_t queued = worker.pending.size();
    std::erase_if(worker.pending, [&](const Command& c) {
      return c.has_join_job() && c.join_job().job_id() == job_id &&
             c.join_job().generation() == gen.number;
    });
    const bool never_told = worker.pending.size() != queued;
    if (worker.status.state() == weft::v1::WORKER_DEAD) continue;
    worker.status.set_state(weft::v1::WORKER_IDLE);
    worker.status.set_reason(absl::StrCat("released from job ", job_id, " generation ",
                                          gen.number));
    if (!completed && !never_told) {
      Command command;
      auto* abort = command.mutable_abort_generation();
      abort->set_job_id(job_id);
      abort->set_generation(gen.number);
      abort->set_reason(reason);
      EnqueueCommandLocked(worker, std::move(command), actions);
    }
  }
  const absl::Status aborted = absl::AbortedError(
      absl::StrCat("generation ", gen.number, " of job ", job_id, " ended: ", reason));
  for (auto& [worker_id, waiter] : gen.join_waiters) {
    timer_.Cancel(waiter.timer_id);
    actions.Add([done = std::move(waiter.done), aborted] { done(aborted); });
  }
  actions.Add([store = gen.store, aborted] { store->Close(aborted); });
  rec.job.mutable_status()->clear_worker_ids();
  AddEventLocked(rec, weft::v1::GENERATION_ENDED,
                 absl::StrCat("generation ", gen.number, " ended: ", reason), actions);
}

void Coordinator::FailGenerationLocked(JobRecord& rec, const std::string& cause, bool permanent,
                                       JobEventType event, Actions& actions) {
  AddEventLocked(rec, event, cause, actions);
  EndGenerationLocked(rec, cause, /*completed=*/false, actions);
  auto* status = rec.job.mutable_status();
  const RecoveryDecision d = DecideAfterFailure(
      status->restarts(), rec.job.spec().fault().max_restarts(), permanent, cause);
  if (d.counts_as_restart) status->set_restarts(status->restarts() + 1);
  if (d.next_state == weft::v1::RECOVERING) {
    recoveries_->Add({{"job_id", status->job_id()}}).Increment();
  }
  if (d.next_state == weft::v1::FAILED) status->set_error(d.reason);
  SetStateLocked(rec, d.next_state, d.reason, actions);
  CommitLocked(rec, actions);
}

void Coordinator::ScheduleLocked(Actions& actions) {
  std::vector<JobRecord*> waiting;
  for (auto& [id, rec] : jobs_) {
    const JobState s = rec.job.status().state();
    if ((s == weft::v1::PENDING || s == weft::v1::RECOVERING) && !rec.generation) {
      waiting.push_back(&rec);
    }
  }
  if (waiting.empty()) return;
  std::sort(waiting.begin(), waiting.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->seq < b->seq; });
  std::vector<WaitingJobView> jobs;
  absl::flat_hash_map<std::string, JobRecord*> by_id;
  for (JobRecord* rec : waiting) {
    const auto& r = rec->job.spec().resources();
    jobs.push_back({rec->job.status().job_id(), r.device_kind(), r.min_workers(), r.max_workers()});
    by_id[rec->job.status().job_id()] = rec;
  }
  // Quarantined workers are left out first; a job that cannot start without them gets them
  // after all (second pass), so quarantine steers work to healthy workers but never starves a
  // job: one whose every worker keeps failing still spends its restart budget and fails.
  std::vector<IdleWorkerView> healthy, quarantined;
  const absl::Time now = Now();
  for (const auto& [id, w] : workers_) {
    if (w.status.state() != weft::v1::WORKER_IDLE) continue;
    (w.quarantined_until > now ? quarantined : healthy)
        .push_back({std::string_view(id), std::string_view(w.status.info().host()),
                    w.status.info().device_index(), w.status.info().device_kind()});
  }
  ScheduleDecision decision = Schedule(jobs, healthy);
  if (!quarantined.empty() && !decision.waiting.empty()) {
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
  }
  for (const auto& placement : decision.placements) {
    StartGenerationLocked(*by_id[placement.job_id], placement, actions);
  }
  for (const auto& [job_id, reason] : decision.waiting) {
    JobRecord& rec = *by_id[job_id];
    if (rec.job.status().state() == weft::v1::RECOVERING) {
      // Too few workers to form the next generation: the job waits for them (it does not
      // fail), and says so the way a job that never started does.
      rec.job.mutable_status()->set_pending_reason(reason);
      SetStateLocked(rec, weft::v1::PENDING, absl::StrCat("waiting for workers: ", reason),
                     actions);
      CommitLocked(rec, actions);
      continue;
    }
    if (rec.job.status().pending_reason() != reason) {
      rec.job.mutable_status()->set_pending_reason(reason);
      NotifyWatchersLocked(rec, actions);
    }
  }
}

void Coordinator::UpdateGaugesLocked() {
  absl::flat_hash_map<int, int> jobs_by_state, workers_by_state;  // keyed by enum value
  for (const auto& [id, rec] : jobs_) ++jobs_by_state[rec.job.status().state()];
  for (const auto& [id, w] : workers_) ++workers_by_state[w.status.state()];
  for (JobState s : kAllJobStates) {
    jobs_gauge_->Add({{"state", JobState_Name(s)}}).Set(jobs_by_state[s]);
  }
  for (WorkerState s : kAllWorkerStates) {
    workers_gauge_->Add({{"state", WorkerState_Name(s)}}).Set(workers_by_state[s]);
  }
}

// ---- jobs ----------------------------------------------------------------------------------

absl::StatusOr<weft::v1::SubmitJobResponse> Coordinator::SubmitJob(const JobSpec& raw_spec) {
  auto spec = NormalizeJobSpec(raw_spec);
  if (!spec.ok()) return spec.status();
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator shutting down; retry");
  if (!spec->resume_from_job().empty() && !jobs_.contains(spec->resume_from_job())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid job spec (1 problem):\nresume_from_job: no job \"", spec->resume_from_job(),
        "\""));
  }
  const int64_t seq = next_job_seq_;
  JobRecord rec;
  rec.seq = seq;
  *rec.job.mutable_spec() = *spec;
  auto* status = rec.job.mutable_status();
  status->set_job_id(absl::StrCat(spec->name(), "-", seq));
  status->set_name(spec->name());
  status->set_state(weft::v1::PENDING);
  status->set_total_steps(spec->training().total_steps());
  ToProtoTime(Now(), status->mutable_create_time());
  const auto& r = spec->resources();
  const std::string gang = r.min_workers() == r.max_workers()
                               ? absl::StrCat(r.min_workers())
                               : absl::StrCat(r.min_workers(), "-", r.max_workers());
  AddEventLocked(rec, weft::v1::SUBMITTED,
                 absl::StrCat("submitted: ", ModelParameterCount(spec->model()),
                              " parameters on ", gang, " ",
                              r.device_kind() == weft::v1::DEVICE_KIND_CUDA ? "CUDA" : "CPU",
                              " worker", r.max_workers() == 1 ? "" : "s"),
                 actions);
  // Durable before acknowledged: a job the client was told about survives any crash.
  if (absl::Status s = db_->PutJob(rec.job, seq + 1); !s.ok()) return s;
  next_job_seq_ = seq + 1;
  rec.last_persist = Now();
  const std::string job_id = status->job_id();
  jobs_.emplace(job_id, std::move(rec));
  jobs_submitted_->Increment();
  recoveries_->Add({{"job_id", job_id}});  // 0 until it recovers: "none" rather than no data
  ScheduleLocked(actions);
  UpdateGaugesLocked();
  weft::v1::SubmitJobResponse response;
  response.set_job_id(job_id);
  *response.mutable_spec() = *spec;
  return response;
}

absl::StatusOr<Job> Coordinator::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return it->second.job;
}

absl::StatusOr<weft::v1::ListJobsResponse> Coordinator::ListJobs(
    const weft::v1::ListJobsRequest& request) {
  if (request.limit() < 0 || request.limit() > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [0, 1000], got ", request.limit()));
  }
  const int limit = request.limit() == 0 ? 100 : request.limit();
  absl::flat_hash_set<int> states(request.states().begin(), request.states().end());
  absl::MutexLock lock(&mu_);
  std::vector<const JobRecord*> selected;
  for (const auto& [id, rec] : jobs_) {
    if (states.empty() || states.contains(rec.job.status().state())) selected.push_back(&rec);
  }
  std::sort(selected.begin(), selected.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->seq > b->seq; });
  weft::v1::ListJobsResponse response;
  for (size_t i = 0; i < selected.size() && static_cast<int>(i) < limit; ++i) {
    JobStatus* status = response.add_jobs();
    *status = selected[i]->job.status();
    // A listing is a summary: the full event log is one GetJob away.
    status->clear_events();
  }
  return response;
}

absl::StatusOr<JobStatus> Coordinator::CancelJob(const std::string& job_id,
                                                 const std::string& reason) {
  Actions actions;
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  JobRecord& rec = it->second;
  if (IsTerminal(rec.job.status().state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended: ", JobState_Name(rec.job.status().state())));
  }
  const std::string why = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  AddEventLocked(rec, weft::v1::CANCEL_REQUESTED, why, actions);
  EndGenerationLocked(rec, why, /*completed=*/false, actions);
  SetStateLocked(rec, weft::v1::CANCELLED, why, actions);
  CommitLocked(rec, actions);
  ScheduleLocked(actions);
  UpdateGaugesLocked();
  return rec.job.status();
}

absl::StatusOr<uint64_t> Coordinator::AddWatcher(const std::string& job_id, Watcher watcher) {
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator shutting down; retry");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  const bool final = IsTerminal(it->second.job.status().state());
  const uint64_t seq = ++update_seq_;
  actions.Add([watcher, status = it->second.job.status(), seq, final] {
    watcher(status, seq, final);
  });
  if (final) return 0;
  const uint64_t id = next_watcher_id_++;
  watchers_.emplace(id, WatcherRecord{job_id, std::move(watcher)});
  return id;
}

void Coordinator::RemoveWatcher(uint64_t id) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(id);
}

// ---- workers -------------------------------------------------------------------------------

// Session tokens follow the worker id rule (letters, digits, ._/:-, 1-128 characters).
constexpr char kBadSessionToken[] =
    "session_token: must be 1-128 characters of letters, digits, ._/:-";

absl::StatusOr<weft::v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    weft::v1::WorkerInfo info, const std::string& session_token) {
  std::vector<std::string> problems;
  if (info.host().empty()) problems.push_back("info.host: required");
  if (info.device_kind() != weft::v1::DEVICE_KIND_CPU &&
      info.device_kind() != weft::v1::DEVICE_KIND_CUDA) {
    problems.push_back("info.device_kind: required: DEVICE_KIND_CPU or DEVICE_KIND_CUDA");
  }
  if (info.device_index() < 0) {
    problems.push_back(absl::StrCat("info.device_index: must be >= 0, got ", info.device_index()));
  }
  if (info.worker_id().empty() && problems.empty()) {
    info.set_worker_id(absl::StrCat(info.host(), "/", DeviceName(info)));
  }
  if (!info.worker_id().empty() && !ValidWorkerId(info.worker_id())) {
    problems.push_back(absl::StrCat("info.worker_id: \"", info.worker_id(),
                                    "\" must be 1-128 characters of letters, digits, ._/:-"));
  }
  if (!session_token.empty() && !ValidWorkerId(session_token)) {
    problems.push_back(kBadSessionToken);
  }
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));

  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator shutting down; retry");
  const std::string id = info.worker_id();
  WorkerRecord& worker = workers_[id];
  int64_t incarnation = worker.status.incarnation() + 1;
  if (worker.status.state() == weft::v1::WORKER_BUSY) {
    // The process that held this id is gone: its generation cannot continue.
    auto job = jobs_.find(worker.status.job_id());
    if (job != jobs_.end() && job->second.generation &&
        job->second.generation->number == worker.status.generation()) {
      failures_->Add({{"kind", "reregistered"}}).Increment();
      worker.status.set_state(weft::v1::WORKER_DEAD);
      FailGenerationLocked(job->second,
                           absl::StrCat("worker ", id, " re-registered (its previous process, "
                                        "rank ", worker.status.rank(), ", is gone)"),
                           /*permanent=*/false, weft::v1::WORKER_LOST, actions);
    }
  }
  if (worker.parked) {
    timer_.Cancel(worker.parked->timer_id);
    actions.Add([done = std::move(worker.parked->done),
                 response = StopResponse(id, incarnation - 1, incarnation)] { done(response); });
    worker.parked.reset();
  }
  worker.pending.clear();
  worker.status = weft::v1::WorkerStatus();
  *worker.status.mutable_info() = std::move(info);
  worker.status.set_state(weft::v1::WORKER_IDLE);
  worker.status.set_incarnation(incarnation);
  worker.status.set_reason("registered");
  worker.last_heartbeat = Now();
  worker.connection_lost = absl::InfiniteFuture();
  worker.session_token = session_token;
  if (!session_token.empty()) sessions_[session_token].worker_id = id;
  ToProtoTime(Now(), worker.status.mutable_register_time());
  ToProtoTime(Now(), worker.status.mutable_last_heartbeat_time());
  spdlog::debug("worker {} registered (incarnation {})", id, incarnation);
  ScheduleLocked(actions);

  weft::v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_incarnation(incarnation);
  response.set_heartbeat_interval_ms(HeartbeatIntervalLocked(worker));
  return response;
}

void Coordinator::Heartbeat(const weft::v1::HeartbeatRequest& request, absl::Time deadline,
                            Done<weft::v1::HeartbeatResponse> done) {
  heartbeats_->Increment();
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) {
    actions.Add([done] { done(absl::UnavailableError("coordinator shutting down; retry")); });
    return;
  }
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end() || request.incarnation() > it->second.status.incarnation()) {
    // The coordinator does not know this process (e.g. it restarted): register again.
    const std::string why = absl::StrCat("worker ", request.worker_id(), " incarnation ",
                                         request.incarnation(), " is not registered; register again");
    actions.Add([done, why] { done(absl::FailedPreconditionError(why)); });
    return;
  }
  if (request.incarnation() < it->second.status.incarnation()) {
    // Another process registered under this id since: this one must go away, not register
    // again (the two would keep displacing each other).
    actions.Add([done, response = StopResponse(request.worker_id(), request.incarnation(),
                                               it->second.status.incarnation())] {
      done(response);
    });
    return;
  }
  WorkerRecord& worker = it->second;
  worker.last_heartbeat = Now();
  ToProtoTime(Now(), worker.status.mutable_last_heartbeat_time());
  if (worker.status.state() == weft::v1::WORKER_DEAD) {
    worker.status.set_state(weft::v1::WORKER_IDLE);
    worker.status.set_reason("heartbeating again after being declared dead");
    // Alive after all (e.g. its connection came back late): judged again from here on.
    worker.connection_lost = absl::InfiniteFuture();
    ScheduleLocked(actions);
  }
  // A worker still training in a generation that ended (it missed the abort, or the
  // coordinator restarted) is told to stop.
  if (!request.job_id().empty() && (worker.status.job_id() != request.job_id() ||
                                    worker.status.generation() != request.generation())) {
    const bool already_told = std::any_of(
        worker.pending.begin(), worker.pending.end(), [&request](const Command& c) {
          return c.has_abort_generation() && c.abort_generation().job_id() == request.job_id() &&
                 c.abort_generation().generation() == request.generation();
        });
    if (!already_told) {
      Command command;
      auto* abort = command.mutable_abort_generation();
      abort->set_job_id(request.job_id());
      abort->set_generation(request.generation());
      abort->set_reason("generation is no longer active");
      worker.pending.push_back(std::move(command));
    }
  }
  const int64_t interval_ms = HeartbeatIntervalLocked(worker);
  if (worker.parked) {
    // A newer heartbeat supersedes a held one (e.g. the client gave up on it).
    timer_.Cancel(worker.parked->timer_id);
    weft::v1::HeartbeatResponse empty;
    empty.set_heartbeat_interval_ms(interval_ms);
    actions.Add([done = std::move(worker.parked->done), empty] { done(empty); });
    worker.parked.reset();
  }
  const int64_t hold_ms = std::min(request.wait_for_command_ms(), interval_ms);
  if (!worker.pending.empty() || hold_ms <= 0) {
    actions.Add([done, response = TakeCommandsLocked(worker, interval_ms)] { done(response); });
    return;
  }
  const absl::Time wake = std::min(deadline, absl::Now() + absl::Milliseconds(hold_ms));
  ParkedHeartbeat parked;
  parked.done = std::move(done);
  parked.interval_ms = interval_ms;
  const std::string worker_id = request.worker_id();
  const int64_t incarnation = request.incarnation();
  // The timer id is only known after Schedule; the callback looks the parked call up by it.
  auto id_holder = std::make_shared<uint64_t>(0);
  parked.timer_id = timer_.Schedule(wake, [this, worker_id, incarnation, id_holder] {
    Actions timer_actions;
    absl::MutexLock timer_lock(&mu_);
    auto w = workers_.find(worker_id);
    if (w == workers_.end() || w->second.status.incarnation() != incarnation ||
        !w->second.parked || w->second.parked->timer_id != *id_holder) {
      return;
    }
    auto response = TakeCommandsLocked(w->second, w->second.parked->interval_ms);
    timer_actions.Add([done = std::move(w->second.parked->done), response] { done(response); });
    w->second.parked.reset();
  });
  *id_holder = parked.timer_id;
  worker.parked = std::move(parked);
}

void Coordinator::BlameWorkerLocked(const std::string& worker_id, JobRecord& rec,
                                    const std::string& cause, Actions& actions) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || options_.quarantine_after_failures <= 0) return;
  WorkerRecord& w = it->second;
  if (++w.consecutive_failures < options_.quarantine_after_failures) return;
  w.quarantined_until = Now() + absl::Milliseconds(options_.quarantine_cooldown_ms);
  const std::string why = absl::StrCat(
      "worker ", worker_id, " quarantined until ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S", w.quarantined_until, absl::UTCTimeZone()),
      " UTC after ", w.consecutive_failures, " failed generations in a row (last: ", cause, ")");
  w.status.set_reason(why);
  w.consecutive_failures = 0;
  spdlog::warn("{}", why);
  AddEventLocked(rec, weft::v1::WORKER_QUARANTINED, why, actions);
}

Coordinator::WorkerRecord* Coordinator::SessionWorkerLocked(const std::string& token) {
  auto session = sessions_.find(token);
  if (session == sessions_.end() || session->second.worker_id.empty()) return nullptr;
  auto worker = workers_.find(session->second.worker_id);
  if (worker == workers_.end() || worker->second.session_token != token) return nullptr;
  return &worker->second;
}

absl::StatusOr<uint64_t> Coordinator::OpenSession(const std::string& token, SessionEnd end) {
  if (!ValidWorkerId(token)) return absl::InvalidArgumentError(kBadSessionToken);
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator shutting down; retry");
  SessionRecord& session = sessions_[token];
  if (session.end) actions.Add([end = std::move(session.end)] { end(absl::OkStatus()); });
  session.id = next_session_id_++;
  session.end = std::move(end);
  // A worker whose connection broke and came back is alive: only a session that stays gone
  // past the grace is fatal.
  if (WorkerRecord* worker = SessionWorkerLocked(token)) {
    worker->connection_lost = absl::InfiniteFuture();
  }
  spdlog::debug("session {} opened ({})", session.id,
                session.worker_id.empty() ? "not registered yet" : session.worker_id);
  return session.id;
}

void Coordinator::SessionClosed(const std::string& token, uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(token);
  // An older stream's cancel can arrive after the live process opened its next one.
  if (it == sessions_.end() || session_id == 0 || it->second.id != session_id) return;
  SessionRecord& session = it->second;
  session.id = 0;
  session.end = nullptr;  // its stream is finishing on its own
  WorkerRecord* worker = SessionWorkerLocked(token);
  spdlog::debug("session {} of {} closed by the transport", session_id,
                worker ? session.worker_id : "no worker");
  if (worker == nullptr) {
    sessions_.erase(it);
  } else if (worker->connection_lost == absl::InfiniteFuture()) {
    worker->connection_lost = Now();
  }
}

absl::StatusOr<weft::v1::ListWorkersResponse> Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  weft::v1::ListWorkersResponse response;
  std::vector<const WorkerRecord*> sorted;
  for (const auto& [id, w] : workers_) sorted.push_back(&w);
  std::sort(sorted.begin(), sorted.end(), [](const WorkerRecord* a, const WorkerRecord* b) {
    const auto& x = a->status.info();
    const auto& y = b->status.info();
    return std::make_tuple(x.host(), x.device_index(), x.worker_id()) <
           std::make_tuple(y.host(), y.device_index(), y.worker_id());
  });
  for (const WorkerRecord* w : sorted) *response.add_workers() = w->status;
  return response;
}

// ---- rendezvous ----------------------------------------------------------------------------

void Coordinator::Join(const weft::v1::JoinRequest& request, absl::Time deadline,
                       Done<weft::v1::JoinResponse> done) {
  Actions actions;
  absl::MutexLock lock(&mu_);
  auto fail = [&actions, &done](absl::Status s) { actions.Add([done, s] { done(s); }); };
  if (shutting_down_) return fail(absl::UnavailableError("coordinator shutting down; retry"));
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end()) {
    return fail(absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found")));
  }
  JobRecord& rec = it->second;
  const int64_t current = rec.job.status().generation();
  if (!rec.generation || rec.generation->number != request.generation()) {
    if (request.generation() >= 1 && request.generation() <= current) {
      return fail(absl::AbortedError(absl::StrCat(
          "generation ", request.generation(), " of job ", request.job_id(),
          " has ended (job is ", JobState_Name(rec.job.status().state()), ")")));
    }
    return fail(absl::NotFoundError(absl::StrCat("job ", request.job_id(), " has no generation ",
                                                 request.generation(), " (current: ", current,
                                                 ")")));
  }
  Generation& gen = *rec.generation;
  auto member = gen.rank_of.find(request.worker_id());
  if (member == gen.rank_of.end()) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not a member of generation ",
                     gen.number, " of job ", request.job_id())));
  }
  auto w = workers_.find(request.worker_id());
  if (w == workers_.end() || w->second.status.incarnation() != request.incarnation()) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "worker ", request.worker_id(), " incarnation ", request.incarnation(), " is stale")));
  }
  gen.joined.insert(request.worker_id());
  if (gen.rendezvous_complete) {
    actions.Add([done, response = JoinResponseFor(rec, member->second, request.include_peers())] {
      done(response);
    });
    return;
  }
  if (auto old = gen.join_waiters.find(request.worker_id()); old != gen.join_waiters.end()) {
    timer_.Cancel(old->second.timer_id);
    actions.Add([done = std::move(old->second.done)] {
      done(absl::CancelledError("superseded by a newer Join from the same worker"));
    });
    gen.join_waiters.erase(old);
  }
  JoinWaiter waiter;
  waiter.done = std::move(done);
  waiter.include_peers = request.include_peers();
  const std::string job_id = request.job_id();
  const std::string worker_id = request.worker_id();
  const int64_t number = gen.number;
  auto id_holder = std::make_shared<uint64_t>(0);
  waiter.timer_id = timer_.Schedule(deadline, [this, job_id, worker_id, number, id_holder] {
    Actions timer_actions;
    absl::MutexLock timer_lock(&mu_);
    auto j = jobs_.find(job_id);
    if (j == jobs_.end() || !j->second.generation || j->second.generation->number != number) {
      return;
    }
    Generation& g = *j->second.generation;
    auto waiter_it = g.join_waiters.find(worker_id);
    if (waiter_it == g.join_waiters.end() || waiter_it->second.timer_id != *id_holder) return;
    std::vector<std::string> missing;
    for (const auto& m : g.members) {
      if (!g.joined.contains(m)) missing.push_back(m);
    }
    const absl::Status s = absl::DeadlineExceededError(absl::StrCat(
        "rendezvous of generation ", number, " incomplete: ", g.joined.size(), " of ",
        g.members.size(), " joined; waiting for ", absl::StrJoin(missing, ", ")));
    timer_actions.Add([done = std::move(waiter_it->second.done), s] { done(s); });
    g.join_waiters.erase(waiter_it);
  });
  *id_holder = waiter.timer_id;
  gen.join_waiters.emplace(request.worker_id(), std::move(waiter));
  if (gen.joined.size() == gen.members.size()) CompleteRendezvousLocked(rec, actions);
}

absl::StatusOr<weft::v1::ReportProgressResponse> Coordinator::ReportProgress(
    const weft::v1::ReportProgressRequest& request) {
  Actions actions;
  absl::MutexLock lock(&mu_);
  weft::v1::ReportProgressResponse response;
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found"));
  }
  JobRecord& rec = it->second;
  if (!rec.generation || rec.generation->number != request.generation()) {
    response.set_continue_training(false);
    return response;
  }
  Generation& gen = *rec.generation;
  const auto member = gen.rank_of.find(request.worker_id());
  if (member == gen.rank_of.end() || member->second != request.rank()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not rank ", request.rank(),
                     " of generation ", gen.number, " of job ", request.job_id()));
  }
  if (!request.error().empty()) {
    failures_->Add({{"kind", "rank_error"}}).Increment();
    FailGenerationLocked(rec,
                         absl::StrCat("rank ", request.rank(), " (worker ", request.worker_id(),
                                      "): ", request.error()),
                         request.error_is_permanent(), weft::v1::RANK_ERROR, actions);
    if (!request.error_is_permanent()) {
      BlameWorkerLocked(request.worker_id(), rec, request.error(), actions);
    }
    ScheduleLocked(actions);
    UpdateGaugesLocked();
    response.set_continue_training(false);
    return response;
  }
  auto* status = rec.job.mutable_status();
  if (request.has_metrics() && request.rank() == 0) {  // other ranks' metrics are not the job's
    if (request.metrics().step() > status->step()) {
      gen.last_progress_time = Now();
      // The generation trains: its members are not failing repeatedly.
      for (const std::string& m : gen.members) {
        if (auto w = workers_.find(m); w != workers_.end()) w->second.consecutive_failures = 0;
      }
    }
    status->set_step(std::max(status->step(), request.metrics().step()));
    *status->mutable_last_metrics() = request.metrics();
    const prometheus::Labels job{{"job_id", request.job_id()}};
    const auto& m = request.metrics();
    job_gauges_.step->Add(job).Set(static_cast<double>(status->step()));
    job_gauges_.loss->Add(job).Set(m.loss());
    job_gauges_.tokens_per_second->Add(job).Set(m.tokens_per_s());
    job_gauges_.mfu->Add(job).Set(m.mfu());
    job_gauges_.step_seconds->Add(job).Set(m.step_ms() / 1000.0);
    ToProtoTime(Now(), status->mutable_last_metrics()->mutable_time());
  }
  if (request.checkpoint_step() > 0 && request.rank() == 0 &&
      request.checkpoint_step() > status->checkpoint_step()) {
    status->set_checkpoint_step(request.checkpoint_step());
    status->set_checkpoint_stall_ms(request.checkpoint_stall_ms());
    status->set_checkpoint_save_ms(request.checkpoint_save_ms());
    const prometheus::Labels job{{"job_id", request.job_id()}};
    job_gauges_.checkpoint_stall->Add(job).Set(request.checkpoint_stall_ms() / 1000.0);
    job_gauges_.checkpoint_save->Add(job).Set(request.checkpoint_save_ms() / 1000.0);
    AddEventLocked(rec, weft::v1::CHECKPOINT_COMMITTED,
                   absl::StrCat("checkpoint at step ", request.checkpoint_step(),
                                absl::StrFormat(" committed (training stalled %.1f ms, saved in "
                                                "%.1f ms)",
                                                request.checkpoint_stall_ms(),
                                                request.checkpoint_save_ms())),
                   actions);
    CommitLocked(rec, actions);
  }
  if (request.finished() && request.rank() == 0) {
    if (!request.model_path().empty()) {
      status->set_model_path(request.model_path());
      if (auto w = workers_.find(request.worker_id()); w != workers_.end()) {
        status->set_model_host(w->second.status.info().host());
      }
    }
    EndGenerationLocked(rec, "completed", /*completed=*/true, actions);
    SetStateLocked(rec, weft::v1::SUCCEEDED,
                   absl::StrCat("completed ", status->step(), " of ", status->total_steps(),
                                " steps"),
                   actions);
    CommitLocked(rec, actions);
    ScheduleLocked(actions);
    UpdateGaugesLocked();
    response.set_continue_training(false);
    return response;
  }
  if (Now() - rec.last_persist >= absl::Milliseconds(options_.metrics_persist_interval_ms)) {
    CommitLocked(rec, actions);
  } else {
    NotifyWatchersLocked(rec, actions);
  }
  response.set_continue_training(true);
  return response;
}

absl::StatusOr<std::shared_ptr<MemoryStore>> Coordinator::GenerationStore(
    const weft::v1::StoreScope& scope) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(scope.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("scope.job_id: job ", scope.job_id(), " not found"));
  }
  const JobRecord& rec = it->second;
  if (rec.generation && rec.generation->number == scope.generation()) return rec.generation->store;
  if (scope.generation() >= 1 && scope.generation() <= rec.job.status().generation()) {
    return absl::AbortedError(absl::StrCat("generation ", scope.generation(), " of job ",
                                           scope.job_id(), " has ended"));
  }
  return absl::NotFoundError(absl::StrCat("scope.generation: job ", scope.job_id(),
                                          " has no generation ", scope.generation(),
                                          " (current: ", rec.job.status().generation(), ")"));
}

// ---- liveness ------------------------------------------------------------------------------

void Coordinator::Tick() {
  Actions actions;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  const absl::Time now = Now();
  std::vector<WorkerLivenessView> workers;
  workers.reserve(workers_.size());
  for (const auto& [id, w] : workers_) {
    workers.push_back({id, w.status.state(), w.last_heartbeat, w.connection_lost,
                       w.status.job_id(), w.status.generation()});
    // A dead worker's age would only grow: its series goes, which shows the worker is gone.
    const prometheus::Labels worker{{"worker_id", id}};
    if (w.status.state() != weft::v1::WORKER_DEAD) {
      heartbeat_age_->Add(worker).Set(absl::ToDoubleSeconds(now - w.last_heartbeat));
    } else if (heartbeat_age_->Has(worker)) {
      heartbeat_age_->Remove(&heartbeat_age_->Add(worker));
    }
  }
  std::vector<GenerationView> generations;
  for (const auto& [id, rec] : jobs_) {
    if (!rec.generation) continue;
    const Generation& g = *rec.generation;
    GenerationView view;
    view.job_id = id;
    view.generation = g.number;
    view.start_time = g.start_time;
    if (!g.rendezvous_complete) {
      for (const auto& m : g.members) {
        if (!g.joined.contains(m)) view.not_joined.push_back(m);
      }
    }
    view.last_progress_time = g.last_progress_time;
    view.step = rec.job.status().step();
    view.heartbeat_timeout_ms = rec.job.spec().fault().heartbeat_timeout_ms();
    view.stall_timeout_ms = rec.job.spec().fault().stall_timeout_ms();
    generations.push_back(std::move(view));
  }
  LivenessOptions liveness;
  liveness.idle_heartbeat_timeout_ms = options_.heartbeat_timeout_ms;
  liveness.rendezvous_timeout_ms = options_.rendezvous_timeout_ms;
  liveness.connection_lost_grace_ms = options_.connection_lost_grace_ms;
  // Closed sessions that no registration refers to any more (the worker re-registered from a
  // new process, or never registered) have nothing left to tell.
  std::vector<std::string> stale_sessions;
  for (const auto& [token, session] : sessions_) {
    if (session.id == 0 && SessionWorkerLocked(token) == nullptr) stale_sessions.push_back(token);
  }
  for (const auto& token : stale_sessions) sessions_.erase(token);

  for (const Failure& f : CheckLiveness(now, workers, generations, liveness)) {
    failures_->Add({{"kind", FailureKindLabel(f.kind)}}).Increment();
    if (f.kind == FailureKind::kHeartbeatTimeout) {
      WorkerRecord& w = workers_[f.worker_id];
      w.status.set_state(weft::v1::WORKER_DEAD);
      w.status.set_reason(f.reason);
      spdlog::warn("{}", f.reason);
    }
    if (f.job_id.empty()) continue;
    auto job = jobs_.find(f.job_id);
    if (job == jobs_.end() || !job->second.generation ||
        job->second.generation->number != f.generation) {
      continue;  // already ended by an earlier failure in this tick
    }
    FailGenerationLocked(job->second, f.reason, /*permanent=*/false,
                         f.kind == FailureKind::kHeartbeatTimeout ? weft::v1::WORKER_LOST
                                                                  : weft::v1::GENERATION_ENDED,
                         actions);
    if (!f.worker_id.empty()) BlameWorkerLocked(f.worker_id, job->second, f.reason, actions);
  }
  ScheduleLocked(actions);
  UpdateGaugesLocked();
}

}  // namespace weft::coordinator
