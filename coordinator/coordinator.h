// The coordinator's state machine: jobs, workers, generations, rendezvous and stores.
//
// Thread-safe; one mutex guards all state (thousands of heartbeats a second fit easily). The
// decisions themselves live in decisions.h as pure functions; this class gathers their inputs,
// applies their results, persists jobs and completes parked calls. Callbacks handed in (call
// completions, watchers) always run with no lock held.
//
// Blocking operations (held heartbeats, Join, store waits) never hold a thread: they park a
// completion callback with a deadline on the DeadlineTimer.
#ifndef WEFT_COORDINATOR_COORDINATOR_H_
#define WEFT_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/deadline_timer.h"
#include "coordinator/decisions.h"
#include "coordinator/memory_store.h"
#include "coordinator/state_db.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "weft/v1/coordinator.pb.h"

namespace weft::coordinator {

struct CoordinatorOptions {
  // Directory of the embedded RocksDB holding jobs. Required.
  std::string data_dir;
  // Heartbeat interval and timeout for workers in no job (jobs set their own).
  int64_t heartbeat_interval_ms = 500;
  int64_t heartbeat_timeout_ms = 3000;
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
};

class Coordinator {
 public:
  using Clock = std::function<absl::Time()>;
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;
  // Receives the job's status after each change; `final` on the last call (the job ended or
  // the coordinator is shutting down). Calls may arrive concurrently and out of order: `seq`
  // increases with every change, so a receiver keeps only the highest it has seen.
  using Watcher =
      std::function<void(const weft::v1::JobStatus& status, uint64_t seq, bool final)>;

  // Opens the state database and loads every job. Jobs found RUNNING (their workers are gone
  // with the old process) go to RECOVERING without using a restart. `registry` receives the
  // metrics. `clock` defaults to absl::Now; with `start_ticking` false nothing runs until
  // Tick() is called (tests drive time).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(
      const CoordinatorOptions& options, std::shared_ptr<prometheus::Registry> registry,
      Clock clock = nullptr, bool start_ticking = true);
  ~Coordinator();  // Shutdown(), then stops the timer.

  // Answers every parked call UNAVAILABLE, ends every watch and session and refuses new calls. Call before
  // shutting the gRPC server down: the server waits for parked calls to finish.
  void Shutdown();

  // ---- Jobs ----
  absl::StatusOr<weft::v1::SubmitJobResponse> SubmitJob(const weft::v1::JobSpec& spec);
  absl::StatusOr<weft::v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<weft::v1::ListJobsResponse> ListJobs(const weft::v1::ListJobsRequest& request);
  absl::StatusOr<weft::v1::JobStatus> CancelJob(const std::string& job_id,
                                                const std::string& reason);
  // Calls `watcher` at once with the current status, then after every change. Returns an id
  // for RemoveWatcher; a watcher of an ended job is called once with final=true and not kept.
  absl::StatusOr<uint64_t> AddWatcher(const std::string& job_id, Watcher watcher);
  void RemoveWatcher(uint64_t id);

  // ---- Workers ----
  // `session_token`: the process's session (see OpenSession); empty: none.
  absl::StatusOr<weft::v1::RegisterWorkerResponse> RegisterWorker(
      weft::v1::WorkerInfo info, const std::string& session_token = "");
  // Answers (through `done`, maybe inline) at once when commands are pending, else holds the
  // call until a command arrives or `deadline` / the held time passes.
  void Heartbeat(const weft::v1::HeartbeatRequest& request, absl::Time deadline,
                 Done<weft::v1::HeartbeatResponse> done);

  // Called with OK when a newer session with the same token replaces a session, UNAVAILABLE at
  // shutdown; never after SessionClosed for the same session.
  using SessionEnd = std::function<void(absl::Status)>;
  // Opens a session under `token` (see Coordinator.OpenSession) and returns its id; the
  // token's previous session, if still open, is ended through its SessionEnd.
  // INVALID_ARGUMENT: a bad token.
  absl::StatusOr<uint64_t> OpenSession(const std::string& token, SessionEnd end);
  // The transport cancelled session `session_id`: when it is its token's current session, the
  // process exited or its connection broke. Unless a new session with the token opens within
  // LivenessOptions::connection_lost_grace_ms, the worker registered with it is declared dead.
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

  // Liveness checks, scheduling and gauges. Runs every tick_interval_ms on the timer thread;
  // tests that own the clock call it directly.
  void Tick();

  DeadlineTimer& timer() { return timer_; }

 private:
  // Side effects (call completions, watcher calls) gathered under the lock and run after it.
  class Actions {
   public:
    void Add(std::function<void()> fn) { fns_.push_back(std::move(fn)); }
    void Run() {
      for (auto& fn : fns_) fn();
      fns_.clear();
    }
    ~Actions() { Run(); }

   private:
    std::vector<std::function<void()>> fns_;
  };

  struct ParkedHeartbeat {
    uint64_t timer_id = 0;
    Done<weft::v1::HeartbeatResponse> done;
    int64_t interval_ms = 0;
  };

  struct WorkerRecord {
    weft::v1::WorkerStatus status;
    absl::Time last_heartbeat;
    // When the transport cancelled the session of session_token (see SessionClosed), if no
    // new one opened since.
    absl::Time connection_lost = absl::InfiniteFuture();
    // RegisterWorker's session_token (empty: none).
    std::string session_token;
    // Generation failures blamed on this worker since a generation last made progress with it.
    int32_t consecutive_failures = 0;
    // Not scheduled before this time (see CoordinatorOptions::quarantine_after_failures).
    absl::Time quarantined_until = absl::InfinitePast();
    std::deque<weft::v1::Command> pending;
    std::optional<ParkedHeartbeat> parked;
  };

  // A process's session (Coordinator.OpenSession), by token.
  struct SessionRecord {
    uint64_t id = 0;      // the open stream's session id; 0: none open
    SessionEnd end;       // ends the open stream
    std::string worker_id;  // registered with this token (empty: not yet)
  };

  struct JoinWaiter {
    uint64_t timer_id = 0;
    bool include_peers = false;
    Done<weft::v1::JoinResponse> done;
  };

  struct Generation {
    int64_t number = 0;
    std::vector<std::string> members;  // rank order
    absl::flat_hash_map<std::string, int32_t> rank_of;
    // By rank: position among the members on the same host, and how many those are.
    std::vector<int32_t> local_rank;
    std::vector<int32_t> local_world_size;
    absl::flat_hash_set<std::string> joined;
    std::map<std::string, JoinWaiter> join_waiters;
    bool rendezvous_complete = false;
    absl::Time start_time;
    absl::Time last_progress_time;
    std::shared_ptr<MemoryStore> store;
  };

  struct JobRecord {
    weft::v1::Job job;
    int64_t seq = 0;
    std::optional<Generation> generation;  // the active one
    absl::Time last_persist;
  };

  struct WatcherRecord {
    std::string job_id;
    Watcher fn;
  };

  Coordinator(const CoordinatorOptions& options, std::shared_ptr<prometheus::Registry> registry,
              Clock clock, std::unique_ptr<StateDb> db);

  absl::Time Now() const { return clock_(); }
  bool IsTerminal(weft::v1::JobState state) const;

  // ---- helpers; all require mu_ ----
  void AddEventLocked(JobRecord& rec, weft::v1::JobEventType type, const std::string& message,
                      Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetStateLocked(JobRecord& rec, weft::v1::JobState state, const std::string& reason,
                      Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Persists the job and notifies its watchers.
  void CommitLocked(JobRecord& rec, Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyWatchersLocked(const JobRecord& rec, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnqueueCommandLocked(WorkerRecord& worker, weft::v1::Command command, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers a parked heartbeat with the pending commands.
  void FlushHeartbeatLocked(WorkerRecord& worker, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer to a heartbeat of an incarnation that a newer registration replaced.
  static weft::v1::HeartbeatResponse StopResponse(const std::string& worker_id, int64_t stale,
                                                  int64_t current);
  weft::v1::HeartbeatResponse TakeCommandsLocked(WorkerRecord& worker, int64_t interval_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t HeartbeatIntervalLocked(const WorkerRecord& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Ends the active generation of `rec`: live members go IDLE (told to abort unless
  // `completed`), parked joins answer ABORTED, the store closes.
  void EndGenerationLocked(JobRecord& rec, const std::string& reason, bool completed,
                           Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A generation failed: end it and decide RECOVERING or FAILED. Mark a dead member
  // WORKER_DEAD first, so it is not told to abort or handed out again.
  void FailGenerationLocked(JobRecord& rec, const std::string& cause, bool permanent,
                            weft::v1::JobEventType event, Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartGenerationLocked(JobRecord& rec, const Placement& placement, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker registered with `token`, if it still is (nullptr otherwise).
  WorkerRecord* SessionWorkerLocked(const std::string& token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a failure of `rec`'s generation against `worker_id`; at the threshold the worker is
  // quarantined and `rec` gets a WORKER_QUARANTINED event.
  void BlameWorkerLocked(const std::string& worker_id, JobRecord& rec, const std::string& cause,
                         Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteRendezvousLocked(JobRecord& rec, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  weft::v1::JoinResponse JoinResponseFor(const JobRecord& rec, int32_t rank, bool include_peers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleTick();

  const CoordinatorOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  const Clock clock_;
  std::unique_ptr<StateDb> db_;

  absl::Mutex mu_;
  int64_t next_job_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watcher_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, SessionRecord> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, WatcherRecord> watchers_ ABSL_GUARDED_BY(mu_);
  uint64_t update_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool ticking_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t tick_timer_id_ ABSL_GUARDED_BY(mu_) = 0;

  // Metrics (prometheus-cpp metrics are thread-safe).
  prometheus::Family<prometheus::Gauge>* jobs_gauge_;
  prometheus::Family<prometheus::Gauge>* workers_gauge_;
  prometheus::Counter* heartbeats_;
  prometheus::Counter* jobs_submitted_;
  prometheus::Histogram* rendezvous_latency_;
  prometheus::Family<prometheus::Counter>* failures_;
  prometheus::Counter* generations_started_;
  prometheus::Family<prometheus::Counter>* recoveries_;
  prometheus::Family<prometheus::Counter>* job_events_;
  prometheus::Family<prometheus::Gauge>* heartbeat_age_;
  // The job's rank-0 metrics, labelled job=<id>.
  struct JobGauges {
    prometheus::Family<prometheus::Gauge>* step;
    prometheus::Family<prometheus::Gauge>* loss;
    prometheus::Family<prometheus::Gauge>* tokens_per_second;
    prometheus::Family<prometheus::Gauge>* mfu;
    prometheus::Family<prometheus::Gauge>* step_seconds;
    prometheus::Family<prometheus::Gauge>* checkpoint_stall;
    prometheus::Family<prometheus::Gauge>* checkpoint_save;
  } job_gauges_;

  // Last member: destroyed first, so no timer callback runs into a half-destroyed object.
  DeadlineTimer timer_;
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_COORDINATOR_H_
