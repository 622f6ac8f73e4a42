// The coordinator's jobs: their records (spec, status, events, the active generation), their
// persistence in the state database, and the watchers of their status.
//
// Part of the coordinator's state: a JobTable is a member of Coordinator guarded by its one
// lock, so every method runs with that lock held. Watcher calls are not made here but added to
// the caller's Actions, which run after the lock is released.
#ifndef WEFT_COORDINATOR_JOB_TABLE_H_
#define WEFT_COORDINATOR_JOB_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/parked_call.h"
#include "coordinator/rendezvous.h"
#include "coordinator/state_db.h"
#include "weft/v1/coordinator.pb.h"

namespace weft::coordinator {

// Job ids are "<name>-<seq>-<suffix>" ("tiny-1-k3x9qa"): the name and the coordinator's
// sequence number keep them readable and ordered; the suffix, drawn at random per job, keeps
// them unique across coordinators and data directories. Everything stored under a job id
// (checkpoints, model files, metric series) relies on that: a job id from a fresh data directory
// must never name an older job's data.
inline constexpr int kJobIdSuffixChars = 6;

// kJobIdSuffixChars characters of lower-case base32 (a-z, 2-7) taken from `random`; the first
// is a letter, so that a suffix is never read as a sequence number. 26 * 32^5: about 8.7e8.
std::string JobIdSuffix(uint64_t random);
// "<name>-<seq>-<JobIdSuffix(random)>".
std::string MakeJobId(const std::string& name, int64_t seq, uint64_t random);
// The <seq> of a job id, also of the "<name>-<seq>" ids stored before the suffix; 0 if none.
int64_t SeqFromJobId(const std::string& job_id);

struct JobRecord {
  weft::v1::Job job;
  int64_t seq = 0;
  std::optional<Generation> generation;  // the active one
  absl::Time last_persist;
  // The last write of this record failed: memory is ahead of the state database until a later
  // write (the next commit, or RetryUnpersisted) succeeds.
  bool unpersisted = false;
  // The worker's message of the rank error that ended the last generation, and the worker
  // that reported it; empty when that generation ended otherwise (or none has). In memory
  // only: a coordinator restart forgets them, which at worst costs one more restart.
  std::string last_rank_error;
  std::string last_rank_error_worker;
  // Workers a rendezvous of this job refused (CheckMembers), by id: the incarnation refused
  // and why. Such a worker is not placed in this job again until it re-registers (a new
  // incarnation: restarted, perhaps with its configuration fixed). In memory only: after a
  // coordinator restart the next rendezvous refuses it again, at no restart's cost.
  std::map<std::string, std::pair<int64_t, std::string>> refused_members;

  const std::string& id() const { return job.status().job_id(); }
  weft::v1::JobState state() const { return job.status().state(); }
  weft::v1::JobStatus* status() { return job.mutable_status(); }
  // The active generation if it is number `number`, else nullptr.
  Generation* ActiveGeneration(int64_t number) {
    return generation && generation->number() == number ? &*generation : nullptr;
  }
};

// Records move when the table grows: hold a JobRecord* only while no job is added.
class JobTable {
 public:
  // Receives the job's status after each change; `final` on the last call (the job ended or
  // the coordinator is shutting down). Calls may arrive concurrently and out of order: `seq`
  // increases with every change, so a receiver keeps only the highest it has seen.
  using Watcher =
      std::function<void(const weft::v1::JobStatus& status, uint64_t seq, bool final)>;

  struct Options {
    // Events kept per job (oldest dropped first).
    int32_t max_events_per_job = 200;
    // A step report persists the job at most this often (state changes always persist).
    int64_t metrics_persist_interval_ms = 1000;
  };

  JobTable(std::unique_ptr<StateDb> db, CoordinatorMetrics* metrics, Clock clock,
           const Options& options);

  // Loads every stored job and the job sequence; returns the ids of the jobs that were
  // RUNNING (their workers went with the previous process).
  absl::StatusOr<std::vector<std::string>> Load();
  size_t size() const { return jobs_.size(); }
  int64_t next_job_seq() const { return next_job_seq_; }

  // ---- Generation stores, written through to the state database (see state_db.h) ----
  // The journal of generation `generation` of `job_id`'s store: writes each change, logging
  // (not failing the store call) when a write fails.
  MemoryStore::Journal StoreJournal(const std::string& job_id, int64_t generation);
  // The stored store of that generation (empty on a read error, which is logged).
  absl::flat_hash_map<std::string, std::string> LoadStore(const std::string& job_id,
                                                          int64_t generation);
  // Forgets the stored stores of `job_id` (its generation ended); logs a failure.
  void DropStores(const std::string& job_id);
  // Forgets the stored stores of every job but `keep` (after Load, the generations kept).
  void DropStoresExcept(const absl::flat_hash_set<std::string>& keep);

  // Validates nothing: `spec` is normalized. Creates the job PENDING with its SUBMITTED event
  // and stores it (and the next sequence) durably before returning.
  absl::StatusOr<JobRecord*> Create(const weft::v1::JobSpec& spec);
  // NOT_FOUND "job <id> not found" (`field`, when set, prefixes the message).
  absl::StatusOr<JobRecord*> Find(const std::string& job_id, const char* field = nullptr);
  bool Contains(const std::string& job_id) const { return jobs_.contains(job_id); }
  // Jobs waiting for a generation (PENDING or RECOVERING without one), oldest first.
  std::vector<JobRecord*> Waiting();
  // Visits each job with an active generation.
  void ForEachGeneration(const std::function<void(JobRecord&)>& fn);
  absl::flat_hash_map<int, int> CountByState() const;
  absl::StatusOr<weft::v1::ListJobsResponse> List(const weft::v1::ListJobsRequest& request) const;

  void AddEvent(JobRecord& rec, weft::v1::JobEventType type, const std::string& message);
  // The one place a job's state changes; the move must pass CheckTransition (a refused move is
  // a coordinator bug: logged, and the state is left as it was). Records a STATE_CHANGED
  // event; entering an ended state sets the end time. Setting the current state does nothing.
  void SetState(JobRecord& rec, weft::v1::JobState state, const std::string& reason);

  // Persists the job and notifies its watchers. For changes no caller is waiting on (the
  // scheduler's, liveness failures): on a failed write the change stays in memory, the record
  // is marked unpersisted and the error is logged; RetryUnpersisted (every tick) or the job's
  // next commit writes it. Within a BeginChange of `rec`, does nothing: the change's
  // CommitChange writes and notifies.
  void Commit(JobRecord& rec, Actions& actions);
  // Commit when the job was last persisted metrics_persist_interval_ms ago, else only notify.
  void CommitIfDue(JobRecord& rec, Actions& actions);
  // Writes every unpersisted record again (each tick, at most once a second); logs when one is
  // written at last.
  void RetryUnpersisted();

  // Changes acknowledged to a caller (a cancel, a worker's final report) are durable first:
  // between BeginChange(rec) and CommitChange(rec), AddEvent and SetState change the record
  // only, holding back their metrics and logs. CommitChange writes the record: when that
  // succeeds the held-back effects happen and the watchers are told; when it fails the record
  // is restored as it was at BeginChange and the write's error (UNAVAILABLE naming the cause,
  // e.g. "No space left on device") is returned, so that the caller refuses the call and
  // nothing in memory says otherwise. One change at a time; the caller makes its other effects
  // (workers told, generations ended) only after CommitChange succeeded.
  void BeginChange(JobRecord& rec);
  absl::Status CommitChange(JobRecord& rec, Actions& actions);
  void NotifyWatchers(const JobRecord& rec, Actions& actions);

  // Calls `watcher` (among `actions`) with the current status, then after every change.
  // Returns an id for RemoveWatcher; a watcher of an ended job is called once with final=true
  // and not kept (id 0).
  absl::StatusOr<uint64_t> AddWatcher(const std::string& job_id, Watcher watcher,
                                      Actions& actions);
  void RemoveWatcher(uint64_t id) { watchers_.erase(id); }
  // Calls every watcher a last time with final=true and forgets them (shutdown).
  void EndWatches(Actions& actions);

 private:
  // The newest commit's time from the job's CHECKPOINT_COMMITTED events (before the first, the
  // job's start_time), so that the age of a running job's checkpoint (and the alert on it) goes
  // on counting across a restart instead of waiting for a commit that may never come.
  void RestoreCheckpointTimes(const JobRecord& rec);

  struct WatcherRecord {
    std::string job_id;
    Watcher fn;
  };
  // A change begun by BeginChange: the record as it was, and the effects held back.
  struct Change {
    JobRecord* rec;
    weft::v1::Job before;
    std::vector<std::function<void()>> effects;
  };
  // Runs `effect` (metrics, logs) now, or at CommitChange when `rec` is being changed.
  void Effect(const JobRecord& rec, std::function<void()> effect);
  // Writes `rec`; on success clears its unpersisted mark.
  absl::Status Write(JobRecord& rec);

  std::unique_ptr<StateDb> db_;
  CoordinatorMetrics* metrics_;
  const Clock clock_;
  const Options options_;
  int64_t next_job_seq_ = 1;
  absl::flat_hash_map<std::string, JobRecord> jobs_;
  uint64_t next_watcher_id_ = 1;
  std::map<uint64_t, WatcherRecord> watchers_;
  uint64_t update_seq_ = 0;
  std::optional<Change> change_;
  absl::Time next_retry_ = absl::InfinitePast();  // of RetryUnpersisted
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_JOB_TABLE_H_
