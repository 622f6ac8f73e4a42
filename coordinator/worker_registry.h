// The coordinator's workers: their registrations, the commands queued for them, their held
// heartbeats, their sessions (Coordinator.OpenSession) and their quarantine counts.
//
// Part of the coordinator's state: a WorkerRegistry is a member of Coordinator guarded by its
// one lock, so every method runs with that lock held (held heartbeats expire under it too).
// Completions are not called here but added to the caller's Actions.
#ifndef WEFT_COORDINATOR_WORKER_REGISTRY_H_
#define WEFT_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/decisions.h"
#include "coordinator/parked_call.h"
#include "weft/v1/coordinator.pb.h"

namespace weft::coordinator {

struct WorkerRecord {
  using HeldHeartbeat = ParkedCall<weft::v1::HeartbeatResponse>;

  // Its state changes only through WorkerRegistry, which keeps counts of states.
  weft::v1::WorkerStatus status;
  absl::Time last_heartbeat;
  // When the transport cancelled the session of session_token (see CloseSession), if no new
  // one opened since.
  absl::Time connection_lost = absl::InfiniteFuture();
  // RegisterWorker's session_token (empty: none).
  std::string session_token;
  // Generation failures blamed on this worker since a generation last made progress with it.
  int32_t consecutive_failures = 0;
  // Not scheduled before this time (see QuarantineOptions).
  absl::Time quarantined_until = absl::InfinitePast();
  // The heartbeat interval of its job while BUSY (set when assigned).
  int64_t busy_heartbeat_interval_ms = 0;
  std::deque<weft::v1::Command> pending;
  std::shared_ptr<HeldHeartbeat> held;

  const std::string& id() const { return status.info().worker_id(); }
  weft::v1::WorkerState state() const { return status.state(); }
};

class WorkerRegistry {
 public:
  using SessionEnd = std::function<void(absl::Status)>;
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;

  struct Options {
    // Heartbeat interval and timeout of workers in no job (jobs set their own), stretched
    // past max_idle_heartbeats_per_s (see IdleHeartbeatFor).
    int64_t idle_heartbeat_interval_ms = 500;
    int64_t idle_heartbeat_timeout_ms = 3000;
    int32_t max_idle_heartbeats_per_s = 0;
    QuarantineOptions quarantine;
  };

  // `guard` is the coordinator's lock, under which held heartbeats expire on `timer`.
  WorkerRegistry(DeadlineTimer& timer, absl::Mutex* guard, CoordinatorMetrics* metrics,
                 Clock clock, const Options& options);

  // INVALID_ARGUMENT listing every problem of a registration (bad info fields, a bad token);
  // fills in the default worker id "<host>/<cpu|cuda><index>".
  static absl::Status CheckRegistration(weft::v1::WorkerInfo& info, const std::string& token);
  // INVALID_ARGUMENT unless `token` is a valid session token.
  static absl::Status CheckSessionToken(const std::string& token);

  // ALREADY_EXISTS when a live worker of another host name already drives the device `info`
  // names on the machine `info.host_id` names: two machines that share a machine id (a cloned
  // disk image), which would be ranked as one host. The worker retries, and gets in once the
  // other is gone or the machines are told apart with --host-id.
  absl::Status CheckDeviceClaim(const weft::v1::WorkerInfo& info);

  WorkerRecord* Find(const std::string& worker_id);
  const weft::v1::WorkerInfo* Info(const std::string& worker_id);
  // The record for `worker_id`, created empty if new.
  WorkerRecord& FindOrAdd(const std::string& worker_id);
  // (Re-)registers the worker as a new incarnation, IDLE. A held heartbeat of the previous
  // incarnation is told to stop; queued commands are dropped.
  void Register(WorkerRecord& worker, weft::v1::WorkerInfo info, const std::string& token,
                Actions& actions);
  int64_t HeartbeatInterval(const WorkerRecord& worker) const;
  // The idle workers' interval and timeout now (IdleHeartbeatFor over the IDLE count).
  IdleHeartbeat IdleHeartbeatNow() const;
  static weft::v1::HeartbeatResponse StopResponse(const std::string& worker_id, int64_t stale,
                                                  int64_t current);

  // A heartbeat of the worker's current incarnation: it is alive (a DEAD one is IDLE again:
  // returns true, the caller reschedules), and if it still trains in a generation it is no
  // longer a member of, it is told to abort that generation.
  bool Beat(WorkerRecord& worker, const weft::v1::HeartbeatRequest& request);
  // Answers the heartbeat at once when commands are pending (or it may not be held), else
  // holds it until a command is queued or min(`deadline`, wait_for_command_ms, the interval).
  // An earlier held heartbeat of the worker is answered empty.
  void Hold(WorkerRecord& worker, int64_t wait_for_command_ms, absl::Time deadline,
            Done<weft::v1::HeartbeatResponse> done, Actions& actions);
  void Enqueue(WorkerRecord& worker, weft::v1::Command command, Actions& actions);

  // Whether the worker's JoinJob for `job_id` `generation` is still queued (not yet taken by
  // a heartbeat answer).
  static bool HasPendingJoin(const WorkerRecord& worker, const std::string& job_id,
                             int64_t generation);
  // Makes the worker rank `rank` of generation `generation` of `job_id` and sends it JoinJob.
  // Also sends it again to a member whose earlier JoinJob was lost (same arguments).
  void Assign(WorkerRecord& worker, const weft::v1::JobSpec& spec, const std::string& job_id,
              int64_t generation, int32_t rank, int32_t world_size, Actions& actions);
  // Makes the worker rank `rank` of generation `generation` of `job_id` without a command: it
  // trains in that generation already (it attached again after a coordinator restart).
  void Attach(WorkerRecord& worker, const weft::v1::JobSpec& spec, const std::string& job_id,
              int64_t generation, int32_t rank);
  // The generation ended: the member goes IDLE (unless DEAD). A member that has not fetched
  // its JoinJob yet never sees it; any other is told to abort unless `completed`.
  void Release(WorkerRecord& worker, const std::string& job_id, int64_t generation,
               const std::string& reason, bool completed, Actions& actions);
  void MarkDead(WorkerRecord& worker, const std::string& reason);

  // A generation failure was blamed on the worker: returns the reason when it is quarantined
  // now (see DecideQuarantine).
  std::optional<std::string> Blame(const std::string& worker_id, const std::string& cause);
  // A generation with these members made progress: none of them is failing repeatedly.
  void ClearFailures(const std::vector<std::string>& members);

  // Idle workers for Schedule, split into healthy and quarantined ones. Views point into the
  // records.
  void IdleViews(std::vector<IdleWorkerView>* healthy, std::vector<IdleWorkerView>* quarantined);
  // Every worker's liveness view; with `refresh_ages`, updates the heartbeat-age gauges on
  // the way (a labelled series per worker: too dear to set for 10K workers every tick).
  std::vector<WorkerLivenessView> LivenessViews(bool refresh_ages);
  // Workers by state (keyed by enum value), kept up to date as states change.
  const absl::flat_hash_map<int, int>& CountByState() const { return state_counts_; }
  // IDLE workers by device kind, quarantined ones included (see WaitingByCounts).
  const IdleCounts& IdleByKind() const { return idle_by_kind_; }
  weft::v1::ListWorkersResponse List() const;

  // Sessions (see Coordinator::OpenSession / SessionClosed).
  uint64_t OpenSession(const std::string& token, SessionEnd end, Actions& actions);
  void CloseSession(const std::string& token, uint64_t session_id);
  // Forgets closed sessions that no registration refers to any more.
  void DropStaleSessions();

  // Answers every held heartbeat and ends every session with `status` (shutdown).
  void Shutdown(const absl::Status& status, Actions& actions);

 private:
  // A process's session, by token.
  struct SessionRecord {
    uint64_t id = 0;        // the open stream's session id; 0: none open
    SessionEnd end;         // ends the open stream
    std::string worker_id;  // registered with this token (empty: not yet)
  };

  // Every state change goes through here, which keeps the counts above: the scheduler asks
  // them on every registration, and counting thousands of workers each time would cost
  // O(workers) per call.
  void SetState(WorkerRecord& worker, weft::v1::WorkerState state);
  // Answers a held heartbeat with the pending commands.
  void Flush(WorkerRecord& worker, Actions& actions);
  weft::v1::HeartbeatResponse TakeCommands(WorkerRecord& worker, int64_t interval_ms);
  // The worker registered with `token`, if it still is (nullptr otherwise).
  WorkerRecord* SessionWorker(const std::string& token);

  DeadlineTimer& timer_;
  absl::Mutex* const guard_;
  CoordinatorMetrics* metrics_;
  const Clock clock_;
  const Options options_;
  absl::flat_hash_map<std::string, WorkerRecord> workers_;
  absl::flat_hash_map<int, int> state_counts_;
  // DeviceKey(info) -> the worker id that last registered for that device of that machine.
  absl::flat_hash_map<std::string, std::string> device_owner_;
  IdleCounts idle_by_kind_;
  uint64_t next_session_id_ = 1;
  absl::flat_hash_map<std::string, SessionRecord> sessions_;
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_WORKER_REGISTRY_H_
