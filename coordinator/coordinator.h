// The coordinator's state machine: jobs, workers, generations, rendezvous and stores.
//
// Thread-safe; one mutex guards all state (thousands of heartbeats a second fit easily). The
// state is kept in parts that each need that lock held: the job table (jobs, events,
// persistence, watchers; job_table.h), the worker registry (workers, sessions, command queues,
// held heartbeats; worker_registry.h), each job's active generation (rendezvous.h) and what
// the jobs' ranks logged (in memory only; job_logs.h); the metrics (coordinator_metrics.h)
// need no lock. The decisions live in decisions.h as pure functions; this class gathers their
// inputs, applies their results across the parts, and completes calls. Callbacks handed in
// (call completions, watchers) always run with no lock held.
//
// Blocking operations (held heartbeats, Join, store waits) never hold a thread: they are
// parked with a deadline (ParkedCall, parked_call.h) on the DeadlineTimer.
#ifndef WEFT_COORDINATOR_COORDINATOR_H_
#define WEFT_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/deadline_timer.h"
#include "coordinator/decisions.h"
#include "coordinator/job_logs.h"
#include "coordinator/job_table.h"
#include "coordinator/memory_store.h"
#include "coordinator/parked_call.h"
#include "coordinator/worker_registry.h"
#include "prometheus/registry.h"
#include "weft/v1/coordinator.pb.h"

namespace weft::coordinator {

struct CoordinatorOptions {
  // Directory of the embedded RocksDB holding jobs. Required.
  std::string data_dir;
  // Heartbeat interval and timeout for workers in no job (jobs set their own).
  int64_t heartbeat_interval_ms = 500;
  int64_t heartbeat_timeout_ms = 3000;
  // Past this many idle heartbeats a second (idle workers * 1000 / heartbeat_interval_ms), the
  // idle interval and timeout stretch so as to stay at it (IdleHeartbeatFor): 10K idle workers
  // heartbeat every 2 s, with a 12 s timeout, instead of 20K heartbeats a second. 0: no cap.
  int32_t max_idle_heartbeats_per_s = 5000;
  // How long a new generation may take for all members to call Join.
  int64_t rendezvous_timeout_ms = 120000;
  // Period of liveness checks, scheduling retries and gauge updates.
  int64_t tick_interval_ms = 100;
  // A worker whose session dropped is dead after this long without a new session
  // (LivenessOptions::connection_lost_grace_ms).
  int64_t connection_lost_grace_ms = 1000;
  // A worker blamed for this many generation failures in a row (it died, hung, or reported a
  // non-permanent error, with no generation making progress with it in between) is
  // quarantined for quarantine_cooldown_ms: jobs get other idle workers first, and it only
  // when a job cannot start without it. 0 disables quarantine.
  int32_t quarantine_after_failures = 2;
  int64_t quarantine_cooldown_ms = 60000;
  // Events kept per job (oldest dropped first).
  int32_t max_events_per_job = 200;
  // A step report persists the job at most this often (state changes always persist).
  int64_t metrics_persist_interval_ms = 1000;
  // Blocking calls (held heartbeats, Join, Store.Wait) never outlive this, whatever deadline
  // the caller set (or did not).
  int64_t max_call_hold_ms = 24 * 3600 * 1000;
  // Held calls are answered this long before the caller's deadline, so the answer arrives in
  // time.
  int64_t call_deadline_margin_ms = 50;
};

class Coordinator {
 public:
  using Clock = weft::coordinator::Clock;
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;
  using Watcher = JobTable::Watcher;

  // Opens the state database and loads every job. A job found RUNNING keeps its generation
  // when that generation's rendezvous had completed: its members, still training, attach to it
  // again as they register (see RegisterWorker) within ReattachWindowMs; if one does not, the
  // generation ends and the job is placed again without using a restart. Its store is the
  // previous process's. A job whose rendezvous had not completed goes to RECOVERING without
  // using a restart either. `registry` receives the metrics. `clock` defaults to absl::Now;
  // with `start_ticking` false nothing runs until Tick() is called (tests drive time).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(
      const CoordinatorOptions& options, std::shared_ptr<prometheus::Registry> registry,
      Clock clock = nullptr, bool start_ticking = true);
  ~Coordinator();  // Shutdown(), then stops the timer.

  // Answers every parked call UNAVAILABLE, ends every watch and session and refuses new
  // calls. Call before shutting the gRPC server down: the server waits for parked calls.
  void Shutdown();

  // When a blocking call whose caller gives up at `caller_deadline` (InfiniteFuture: never)
  // must be answered: call_deadline_margin_ms before it, and at most max_call_hold_ms from now.
  absl::Time HoldDeadline(absl::Time caller_deadline) const;

  // ---- Jobs ----
  absl::StatusOr<weft::v1::SubmitJobResponse> SubmitJob(const weft::v1::JobSpec& spec);
  absl::StatusOr<weft::v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<weft::v1::ListJobsResponse> ListJobs(const weft::v1::ListJobsRequest& request);
  // The job CANCELLED, stored before anything else changes: when the state database cannot
  // store it, the error (UNAVAILABLE naming the cause) and the job goes on as before.
  absl::StatusOr<weft::v1::JobStatus> CancelJob(const std::string& job_id,
                                                const std::string& reason);
  // Calls `watcher` at once with the current status, then after every change (see
  // JobTable::Watcher). Returns an id for RemoveWatcher; a watcher of an ended job is called
  // once with final=true and not kept.
  absl::StatusOr<uint64_t> AddWatcher(const std::string& job_id, Watcher watcher);
  void RemoveWatcher(uint64_t id);
  // What the job's ranks logged (see JobLogs): NOT_FOUND for an unknown job, INVALID_ARGUMENT
  // naming a negative rank, after_seq or max_lines; `state` is the job's state now.
  absl::StatusOr<weft::v1::GetJobLogsResponse> GetJobLogs(
      const weft::v1::GetJobLogsRequest& request);

  // ---- Workers ----
  // `session_token`: the process's session (see OpenSession); empty: none. `running`: the
  // generation the worker still trains in (RegisterWorkerRequest.running), or null: it attaches
  // to it again when DecideReattach allows (the answer says so), and otherwise registers idle.
  // A worker that a kept generation awaits and that registers without attaching to it is a
  // new process: that generation fails at once.
  absl::StatusOr<weft::v1::RegisterWorkerResponse> RegisterWorker(
      weft::v1::WorkerInfo info, const std::string& session_token = "",
      const weft::v1::RunningGeneration* running = nullptr);
  // Answers (through `done`, maybe inline) at once when commands are pending, else holds the
  // call until a command arrives or `deadline` / the held time passes. Keeps the request's
  // log lines (JobLogs) once it knows the worker's incarnation.
  void Heartbeat(const weft::v1::HeartbeatRequest& request, absl::Time deadline,
                 Done<weft::v1::HeartbeatResponse> done);

  // Called with OK when a newer session with the same token replaces a session, UNAVAILABLE at
  // shutdown; never after SessionClosed for the same session.
  using SessionEnd = WorkerRegistry::SessionEnd;
  // Opens a session under `token` (see Coordinator.OpenSession) and returns its id; the
  // token's previous session, if still open, is ended through its SessionEnd.
  // INVALID_ARGUMENT: a bad token.
  absl::StatusOr<uint64_t> OpenSession(const std::string& token, SessionEnd end);
  // The transport cancelled session `session_id`: when it is its token's current session, the
  // process exited or its connection broke. Unless a new session with the token opens within
  // LivenessOptions::connection_lost_grace_ms, the worker registered with it is declared dead
  // (failure kind connection_lost).
  void SessionClosed(const std::string& token, uint64_t session_id);
  absl::StatusOr<weft::v1::ListWorkersResponse> ListWorkers();

  // ---- Rendezvous ----
  // Completes every member's Join once all of them joined; DEADLINE_EXCEEDED at `deadline`;
  // ABORTED if the generation ends first.
  void Join(const weft::v1::JoinRequest& request, absl::Time deadline,
            Done<weft::v1::JoinResponse> done);
  absl::StatusOr<weft::v1::ReportProgressResponse> ReportProgress(
      const weft::v1::ReportProgressRequest& request);

  // The store of an active generation. ABORTED if that generation has ended, NOT_FOUND if the
  // job or generation never existed.
  absl::StatusOr<std::shared_ptr<MemoryStore>> GenerationStore(const weft::v1::StoreScope& scope);
  // GenerationStore for an operation on `key`: INVALID_ARGUMENT when the key is empty or
  // longer than 4096 bytes.
  absl::StatusOr<std::shared_ptr<MemoryStore>> StoreForKey(const weft::v1::StoreScope& scope,
                                                           const std::string& key);
  // Answers OK once every key of `keys` exists in the scope's store; DEADLINE_EXCEEDED naming
  // the missing keys at `deadline` or after `timeout_ms` (0: no timeout of its own); the
  // store's closing status if its generation ends first.
  void WaitForKeys(const weft::v1::StoreScope& scope, const std::vector<std::string>& keys,
                   int64_t timeout_ms, absl::Time deadline, Done<weft::v1::StoreWaitResponse> done);

  // Liveness checks, scheduling and gauges. Runs every tick_interval_ms on the timer thread;
  // tests that own the clock call it directly.
  void Tick();

 private:
  Coordinator(const CoordinatorOptions& options, std::shared_ptr<prometheus::Registry> registry,
              Clock clock, std::unique_ptr<StateDb> db);

  absl::Time Now() const { return clock_(); }
  // INVALID_ARGUMENT naming `field` unless `key` is a valid store key.
  static absl::Status CheckStoreKey(const std::string& key, const char* field);
  absl::Status Refusal() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- helpers across the parts; all require mu_ ----
  // Ends the active generation of `rec`: RecordGenerationEndLocked, then
  // ReleaseGenerationLocked.
  void EndGenerationLocked(JobRecord& rec, const std::string& reason, bool completed,
                           Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's record of the end of its active generation (a GENERATION_ENDED event, no
  // workers); the generation itself goes on until ReleaseGenerationLocked. Split so that a
  // change stored before it is acted on (JobTable::BeginChange) can record the end first.
  void RecordGenerationEndLocked(JobRecord& rec, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the active generation itself: live members go IDLE (told to abort unless
  // `completed`), parked joins answer ABORTED, the store closes.
  void ReleaseGenerationLocked(JobRecord& rec, const std::string& reason, bool completed,
                               Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A generation failed: end it and decide RECOVERING or FAILED. Mark a dead member
  // WORKER_DEAD first, so it is not told to abort or handed out again.
  // Without `spends_restart` (a setup failure placed anew, DecideSetupFailure) the job goes to
  // RECOVERING whatever its budget, using none of it.
  void FailGenerationLocked(JobRecord& rec, const std::string& cause, bool permanent,
                            weft::v1::JobEventType event, Actions& actions,
                            bool spends_restart = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartGenerationLocked(JobRecord& rec, const Placement& placement, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- coordinator restarts (coordinator_restart.cc) ----
  // After Open loaded the RUNNING job `rec`: keeps its generation for its members to attach to
  // again (true), or, when its rendezvous had not completed, sends the job to RECOVERING.
  bool KeepGenerationLocked(JobRecord& rec, Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RegisterWorker's part for `worker_id`, before it is registered: whether it attaches to
  // `running` (and why not), and the end of a kept generation that awaits it in vain.
  ReattachDecision ReattachLocked(const std::string& worker_id,
                                  const weft::v1::RunningGeneration* running, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The registered `worker` attached to `running` (ReattachLocked said it may).
  void AttachLocked(WorkerRecord& worker, const weft::v1::RunningGeneration& running,
                    Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Schedules waiting jobs, then updates the state gauges.
  void ScheduleLocked(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a failure of `rec`'s generation against `worker_id`; at the threshold the worker is
  // quarantined and `rec` gets a WORKER_QUARANTINED event.
  void BlameWorkerLocked(const std::string& worker_id, JobRecord& rec, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every member joined: checks them (CheckMembers), then either answers their joins or
  // refuses the generation (RefuseMembersLocked).
  void CompleteRendezvousLocked(JobRecord& rec, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a generation whose members cannot train together, without spending a restart: the
  // refused members are left out of the job's placements until they re-register, and the
  // job is placed again (or fails, for a `check.job_error`).
  void RefuseMembersLocked(JobRecord& rec, const MemberCheck& check, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's view for Schedule, its refused members among them.
  WaitingJobView WaitingViewLocked(const JobRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member heartbeating without a job whose JoinJob was lost gets it again (LostAssignment).
  void ResendLostAssignmentLocked(WorkerRecord& worker, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Generation::PeerInfo PeerInfoLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The parts of ReportProgress: a rank's error, rank 0's step metrics and checkpoint, the end.
  void RankErrorLocked(JobRecord& rec, const weft::v1::ReportProgressRequest& request,
                       Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordStepLocked(JobRecord& rec, const weft::v1::ReportProgressRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What DecideSetupFailure needs of `request`'s rank error in `rec`'s active generation.
  SetupFailureView SetupViewLocked(const JobRecord& rec,
                                   const weft::v1::ReportProgressRequest& request, bool permanent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank 0's word on where the generation's state came from: a CHECKPOINT_RESTORED or
  // STARTED_FRESH event.
  void RecordStartLocked(JobRecord& rec, const weft::v1::GenerationStart& start,
                         Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why spec.resume_from_job cannot be resumed from (no such job, another model shape), empty
  // when it can or is unset.
  std::string ResumeProblemLocked(const weft::v1::JobSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordCheckpointLocked(JobRecord& rec, const weft::v1::ReportProgressRequest& request,
                              Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the change ReportProgress began (JobTable::BeginChange): the job SUCCEEDED once that
  // is stored; the write's error, and the job as it was, otherwise.
  absl::Status FinishJobLocked(JobRecord& rec, const weft::v1::ReportProgressRequest& request,
                               Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the generations of the failures CheckLiveness found.
  void ApplyFailuresLocked(const std::vector<Failure>& failures, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleTick();

  const CoordinatorOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  const Clock clock_;
  CoordinatorMetrics metrics_;

  absl::Mutex mu_;
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  JobLogs logs_ ABSL_GUARDED_BY(mu_);
  bool ticking_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t tick_timer_id_ ABSL_GUARDED_BY(mu_) = 0;
  // When a tick next refreshes the per-worker heartbeat-age gauges (see Tick).
  absl::Time next_age_refresh_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // Last member: destroyed first, so no timer callback runs into a half-destroyed object.
  DeadlineTimer timer_;
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_COORDINATOR_H_
