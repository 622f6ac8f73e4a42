// The coordinator's decisions as pure functions of (now, state, options): which jobs start on
// which workers, which workers or generations have failed, and what a failure does to a job.
// Each result carries a reason a person can read in `trainctl status`. No I/O, no clocks, no
// locks: the stateful Coordinator gathers views, calls these, and applies the results.
#ifndef WEFT_COORDINATOR_DECISIONS_H_
#define WEFT_COORDINATOR_DECISIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "weft/v1/job.pb.h"
#include "weft/v1/worker.pb.h"

namespace weft::coordinator {

// ---- Scheduling ----------------------------------------------------------------------------

// Views point into the caller's records, which must outlive the call.
struct IdleWorkerView {
  std::string_view worker_id;
  // WorkerInfo.host_id: the machine, as its workers state it.
  std::string_view host_id;
  int32_t device_index = 0;
  weft::v1::DeviceKind device_kind = weft::v1::DEVICE_KIND_UNSPECIFIED;
  // WorkerInfo.gpu_uuid: workers with one non-empty UUID drive one physical GPU, and a
  // placement takes at most one of them. Empty: a device of its own (CPU workers).
  std::string_view gpu_uuid;
};

// A job waiting for a generation (PENDING or RECOVERING), in queue (submission) order.
struct WaitingJobView {
  std::string job_id;
  weft::v1::DeviceKind device_kind = weft::v1::DEVICE_KIND_UNSPECIFIED;
  int32_t min_workers = 1;
  int32_t max_workers = 1;
  // The world must be a multiple of this (hybrid sharding's sharding.group_size, whose
  // validation makes min_workers one too): the workers taken are rounded down to it.
  int32_t world_multiple = 1;
  // Workers this job must not be placed on (refused at one of its rendezvous and not
  // re-registered since), with why.
  std::vector<std::pair<std::string, std::string>> excluded;
};

struct Placement {
  std::string job_id;
  // The chosen workers in rank order.
  std::vector<std::string> worker_ids;
  std::string reason;
};

struct ScheduleDecision {
  std::vector<Placement> placements;
  // Jobs left waiting, with why ("needs 4 idle CPU workers, 2 idle").
  std::vector<std::pair<std::string, std::string>> waiting;
};

// Gang scheduling, first come first served per device kind: the oldest waiting job of a kind
// takes up to max_workers idle workers of that kind (rounded down to a multiple of
// world_multiple) once at least min_workers exist; until it
// can, later jobs of that kind wait too (so a large gang is never starved by small ones).
// A job takes at most one worker of a physical GPU (IdleWorkerView.gpu_uuid) and none of its
// `excluded` workers; the waiting reason counts the idle workers it left aside for either.
// Workers are taken in placement order (SortInPlacementOrder), so a job spans as few hosts as
// the idle workers allow, and each placement lists its workers in rank order
// (SortInRankOrder). O(workers) when nothing can be placed, which is what most calls (one per
// registration) find.
ScheduleDecision Schedule(const std::vector<WaitingJobView>& jobs,
                          const std::vector<IdleWorkerView>& idle_workers);

// Idle workers by device kind.
using IdleCounts = absl::flat_hash_map<weft::v1::DeviceKind, size_t>;

// Schedule's decision when, from counts of idle workers alone, no job can be placed: the jobs
// that wait, with Schedule's reasons; nullopt when some job can be placed (Schedule must then
// choose the workers). Count quarantined workers too, as ScheduleSparingQuarantined hands
// them out before a job waits; then the decision is that of ScheduleSparingQuarantined. O(jobs):
// the call on each of thousands of registrations needs no list of every idle worker.
std::optional<ScheduleDecision> WaitingByCounts(const std::vector<WaitingJobView>& jobs,
                                                const IdleCounts& idle);

// Rank order: by host_id, then device index, then worker id — so the ranks of one host are
// contiguous and follow device order, and the same set of workers always gets the same ranks.
void SortInRankOrder(std::vector<IdleWorkerView>* workers);

// The order idle workers of one kind are taken in: hosts with the most idle workers first
// (ties by host_id), each host's workers in rank order. Taking a prefix then spans the fewest
// hosts: a job of 8 on 8-GPU nodes takes one whole idle node rather than the 3 idle GPUs of a
// busy node and 5 of another, which would send its collectives over the network.
void SortInPlacementOrder(std::vector<IdleWorkerView>* workers);

// Schedule, but quarantined workers are left out first; a job that cannot start without them
// gets them after all (second pass), so quarantine steers work to healthy workers but never
// starves a job: one whose every worker keeps failing still spends its restart budget and fails.
ScheduleDecision ScheduleSparingQuarantined(const std::vector<WaitingJobView>& jobs,
                                            const std::vector<IdleWorkerView>& healthy,
                                            const std::vector<IdleWorkerView>& quarantined);

// ---- Liveness ------------------------------------------------------------------------------

struct WorkerLivenessView {
  std::string worker_id;
  weft::v1::WorkerState state = weft::v1::WORKER_IDLE;
  absl::Time last_heartbeat;
  // When the transport cancelled the worker's session (its process exited, or its connection
  // broke) with no new session since; InfiniteFuture otherwise.
  absl::Time connection_lost = absl::InfiniteFuture();
  // Set when the worker is a member of an active generation.
  std::string job_id;
  int64_t generation = 0;
};

struct GenerationView {
  std::string job_id;
  int64_t generation = 0;
  absl::Time start_time;
  // Members that have not called Join yet (empty once the rendezvous completed).
  std::vector<std::string> not_joined;
  // After a coordinator restart: members of the kept generation that have not attached to it
  // again yet, and until when they may.
  std::vector<std::string> not_reattached;
  absl::Time reattach_deadline = absl::InfiniteFuture();
  // When the rendezvous completed or a step last advanced.
  absl::Time last_progress_time;
  int64_t step = 0;
  int64_t heartbeat_timeout_ms = 3000;
  int64_t stall_timeout_ms = 300000;
};

struct LivenessOptions {
  // Timeout for workers in no generation.
  int64_t idle_heartbeat_timeout_ms = 3000;
  // How long a generation may take to gather all its members in Join.
  int64_t rendezvous_timeout_ms = 120000;
  // A worker whose session (Coordinator.OpenSession) was cancelled by the transport, and that
  // has not opened a new one within this long (or its heartbeat timeout, if shorter), is
  // dead: a process that exits drops its connection at once, so it is caught in about this
  // time instead of the full heartbeat timeout. A live worker whose connection blips reopens
  // its session within its backoff (100 ms first), well inside it.
  int64_t connection_lost_grace_ms = 1000;
};

// How often idle workers heartbeat, and after how long without one they are dead: the
// configured interval and timeout, both stretched by the same factor when `idle_workers`
// heartbeating at that interval would send more than `max_per_s` heartbeats a second (0: no
// cap). Idle heartbeats are long-polls, so a longer one delays no command (a command answers
// the held call at once), and a process that exits is caught by its session, not its
// heartbeat; what grows is the time to notice an idle worker that hangs while connected.
struct IdleHeartbeat {
  int64_t interval_ms = 500;
  int64_t timeout_ms = 3000;
};
IdleHeartbeat IdleHeartbeatFor(int64_t idle_workers, const IdleHeartbeat& configured,
                               int32_t max_per_s);

// kConnectionLost: the worker's session dropped and stayed gone past the grace (its process
// exited or its host became unreachable), which is told apart from plain silence.
// kReattachTimeout: after a coordinator restart, a member of the generation it kept did not
// attach again in time (its process died while the coordinator was away).
enum class FailureKind {
  kHeartbeatTimeout,
  kRendezvousTimeout,
  kStall,
  kConnectionLost,
  kReattachTimeout
};

// Whether the failure is a worker's death (it names the worker, who is declared dead).
bool IsWorkerDeath(FailureKind kind);

struct Failure {
  FailureKind kind;
  // The dead worker (kHeartbeatTimeout, kConnectionLost), else empty.
  std::string worker_id;
  // The generation that must end; empty job_id for an idle worker's death.
  std::string job_id;
  int64_t generation = 0;
  std::string reason;
};

// Workers past their heartbeat deadline (the deadline of their generation's job while busy,
// the idle one otherwise), generations whose rendezvous took too long, generations kept over
// a coordinator restart whose members did not all attach again by the deadline, and
// generations whose step has not advanced within the job's stall timeout.
std::vector<Failure> CheckLiveness(absl::Time now, const std::vector<WorkerLivenessView>& workers,
                                   const std::vector<GenerationView>& generations,
                                   const LivenessOptions& options);

// ---- Recovery ------------------------------------------------------------------------------

struct RecoveryDecision {
  // RECOVERING (form the next generation) or FAILED.
  weft::v1::JobState next_state;
  // Whether this failure uses one of the job's restarts.
  bool counts_as_restart = false;
  std::string reason;
};

// What a job does after its generation ended because of `cause`.
RecoveryDecision DecideAfterFailure(int32_t restarts_so_far, int32_t max_restarts,
                                    bool permanent_error, const std::string& cause);

// Whether a rank's `error` (the worker's own message, e.g. "step 1200: ...") from `worker`
// repeats word for word the rank error that ended the job's previous generation (`previous`
// from `previous_worker`; empty when that generation ended otherwise) on ANOTHER worker. A
// failure that comes back the same after a restart, from the same checkpoint and batches but
// on another machine, is the job's — a bug, a kernel that faults on this shape, a batch that
// breaks the model — and another restart would only replay it, so the coordinator treats it as
// permanent. From the same worker it may be that worker's (a failing GPU): quarantine
// (DecideQuarantine) sets the worker aside instead. The reason to append to the cause comes
// back too.
struct RepeatDecision {
  bool repeated = false;
  std::string reason;  // empty unless repeated
};
RepeatDecision DecideRepeatedRankError(const std::string& previous,
                                       const std::string& previous_worker,
                                       const std::string& error, const std::string& worker);

// ---- Quarantine ----------------------------------------------------------------------------

struct QuarantineOptions {
  // Generation failures in a row blamed on one worker that quarantine it; 0 disables it.
  int32_t after_failures = 2;
  // How long a quarantined worker is given no job while others are idle.
  int64_t cooldown_ms = 60000;
};

struct QuarantineDecision {
  // The worker's failures in a row after this one (back to 0 when it is quarantined now).
  int32_t consecutive_failures = 0;
  // Set when the worker is quarantined now: it is not scheduled before this time.
  std::optional<absl::Time> quarantined_until;
  std::string reason;
};

// A failure of a generation was blamed on `worker_id`, which had `failures_so_far` in a row
// before it. With quarantine disabled the count is left as it was.
QuarantineDecision DecideQuarantine(absl::Time now, const std::string& worker_id,
                                    int32_t failures_so_far, const std::string& cause,
                                    const QuarantineOptions& options);

// ---- Assignments ---------------------------------------------------------------------------

// A heartbeat that names no job, from a worker the coordinator holds as a member of a
// generation, and what the coordinator knows of that assignment.
struct AssignmentView {
  std::string worker_id;
  // The generation the worker is a member of (WorkerStatus job_id and generation).
  std::string job_id;
  int64_t generation = 0;
  // That generation is still its job's active one.
  bool generation_active = false;
  // The worker called Join in it.
  bool joined = false;
  // Its JoinJob is still queued, not yet taken by a heartbeat answer.
  bool join_queued = false;
};

// Whether the member's JoinJob must be sent again: yes when the heartbeat answer that carried
// it never reached the worker (its connection was reset after the coordinator wrote it, or the
// call's deadline passed first), which the worker shows by heartbeating without a job while
// it has neither joined nor a JoinJob queued. A worker that received it names the job in
// every heartbeat until its run ends, and one whose run ended had joined first. Without this
// the generation waits out its rendezvous timeout and costs a restart. The reason, for the
// coordinator's log, when it must.
std::optional<std::string> LostAssignment(const AssignmentView& view);

// ---- Rendezvous ----------------------------------------------------------------------------

// What a member brings to a generation, from its registration and its Join.
struct MemberView {
  std::string worker_id;
  // WorkerInfo.version, WorkerInfo.checkpointd and JoinRequest.data_error.
  std::string version;
  std::string checkpointd;
  std::string data_error;
};

struct RefusedMember {
  std::string worker_id;
  std::string reason;
};

struct MemberCheck {
  // Members that cannot train with their peers, in rank order, each with why.
  std::vector<RefusedMember> refused;
  // Set when the job itself cannot train on any placement (every member fails the same way,
  // e.g. no member can read its data): the job fails with this error.
  std::string job_error;
};

// Whether the members of a complete rendezvous (rank order) can train together; the
// generation is refused at once when not, rather than hanging at the first collective or
// save that needs the missing piece:
// - data: a member that cannot read the job's data while a peer can is refused; when none
//   can, the job's data is wrong (job_error names the path).
// - release: members whose weft-worker release differs from the most common one (ties: rank
//   0's) are refused: collectives and checkpoints are only compatible within a release.
// - checkpointd: when the job checkpoints (`checkpoints`), members without one are refused
//   while any peer has one: the peers would wait for their shard at every save. When none
//   has one the job trains without checkpoints (the workers say so), as before.
MemberCheck CheckMembers(const std::vector<MemberView>& members, bool checkpoints);

// ---- Coordinator restarts ------------------------------------------------------------------

// A coordinator that restarts while a generation trains keeps it (its rendezvous had completed)
// and lets its members, still training, attach to it again when they register.

// What the coordinator has for the generation a registering worker says it still trains in
// (RegisterWorkerRequest.running).
struct ReattachView {
  bool job_found = false;
  weft::v1::JobState state = weft::v1::JOB_STATE_UNSPECIFIED;
  // The job's active generation; 0 when it has none.
  int64_t active_generation = 0;
  // The worker's rank in it; -1: not a member.
  int32_t member_rank = -1;
};

struct ReattachDecision {
  bool attach = false;
  // Why not (empty when it attaches).
  std::string reason;
};

// Whether `worker_id`, which says it is rank `rank` of generation `generation` of `job_id`,
// is that generation's member again: only while the job RUNS that very generation with it at
// that rank. Otherwise it drops the generation (the reason says why) and registers idle.
ReattachDecision DecideReattach(const std::string& worker_id, const std::string& job_id,
                                int64_t generation, int32_t rank, const ReattachView& view);

// How long the members of a kept generation have to attach again after the restart: the
// job's heartbeat timeout (a live worker heartbeats, finds itself unknown and registers well
// within it), but never less than `floor_ms` (a worker's heartbeat backoff while the
// coordinator was away reaches 2 s).
int64_t ReattachWindowMs(int64_t heartbeat_timeout_ms, int64_t floor_ms = 10000);

// ---- Job lifecycle -------------------------------------------------------------------------

// SUCCEEDED, FAILED and CANCELLED: the job never runs again and never changes state again.
bool JobHasEnded(weft::v1::JobState state);

// Whether a job may go from `from` to `to`: OK, or FAILED_PRECONDITION naming both states and
// why the move is refused. The allowed moves:
//   PENDING    -> RUNNING (a generation was assigned), CANCELLED
//   RUNNING    -> RECOVERING (restart), FAILED, SUCCEEDED, CANCELLED
//   RECOVERING -> RUNNING (the next generation), PENDING (too few workers), CANCELLED
// An ended job moves nowhere; a job never "moves" to the state it is in.
absl::Status CheckTransition(weft::v1::JobState from, weft::v1::JobState to);

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_DECISIONS_H_
