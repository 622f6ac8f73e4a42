// A job's active generation: its members in rank order, who has joined, the parked Join calls
// and the generation's store. A Generation lives inside its job's record (JobTable), so every
// method needs the coordinator's lock held, like the rest of that part.
#ifndef WEFT_COORDINATOR_RENDEZVOUS_H_
#define WEFT_COORDINATOR_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/decisions.h"
#include "coordinator/memory_store.h"
#include "coordinator/parked_call.h"
#include "weft/v1/coordinator.pb.h"

namespace weft::coordinator {

class Generation {
 public:
  using JoinCall = ParkedCall<weft::v1::JoinResponse>;
  // What the rendezvous tells about a peer: its registration (host, device, address).
  using PeerInfo = std::function<const weft::v1::WorkerInfo*(const std::string& worker_id)>;

  // Generation `number` of a job on `members` (rank order); `host_of` gives each member's
  // host, from which local ranks are derived.
  Generation(int64_t number, std::vector<std::string> members,
             const std::function<std::string(const std::string&)>& host_of, absl::Time now);

  // A generation a previous coordinator process completed the rendezvous of, its store holding
  // `store` (that process's journal of it): its members are still training and may attach to
  // it again (MarkReattached) until `reattach_deadline`, after which CheckLiveness ends it.
  // Local ranks are not known again (no peer has registered yet), so that a Join of it could
  // not be answered: none is expected, since every member joined before.
  static Generation Restored(int64_t number, std::vector<std::string> members,
                             std::shared_ptr<MemoryStore> store, absl::Time now,
                             absl::Time reattach_deadline);

  int64_t number() const { return number_; }
  const std::vector<std::string>& members() const { return members_; }
  int32_t world_size() const { return static_cast<int32_t>(members_.size()); }
  // The member's rank, or -1 for a worker that is not a member.
  int32_t RankOf(const std::string& worker_id) const;
  bool rendezvous_complete() const { return rendezvous_complete_; }
  const std::shared_ptr<MemoryStore>& store() const { return store_; }
  absl::Time start_time() const { return start_time_; }

  // The member joined, saying why it cannot read the job's data (empty when it can); true
  // once every member has (the caller then checks them and completes the rendezvous). A
  // member that joins again replaces its data error.
  bool MarkJoined(const std::string& worker_id, const std::string& data_error);
  // What the member said of its data when it joined ("" when it can read it).
  const std::string& DataError(const std::string& worker_id) const;
  // Whether the member has called Join (once is enough: it stays joined).
  bool HasJoined(const std::string& worker_id) const { return joined_.contains(worker_id); }
  // Members that have not called Join yet, in rank order.
  std::vector<std::string> NotJoined() const;
  weft::v1::JoinResponse ResponseFor(int32_t rank, bool include_peers,
                                     const PeerInfo& peer) const;

  // Parks a member's Join until the rendezvous completes or `deadline`; a Join of the same
  // member parked earlier is answered CANCELLED. `expire` answers the deadline (it runs under
  // `guard`, which must be held here).
  void ParkJoin(const std::string& worker_id, bool include_peers, DeadlineTimer& timer,
                absl::Mutex* guard, absl::Time deadline, JoinCall::Done done,
                JoinCall::Expiry expire, Actions& actions);
  // At the deadline of a parked Join: forgets it and says who is still missing.
  absl::Status ExpireJoin(const std::string& worker_id, const JoinCall& call);
  // Every member joined: answers the parked joins; returns how long the rendezvous took.
  absl::Duration CompleteRendezvous(absl::Time now, const PeerInfo& peer, Actions& actions);
  // Answers every parked Join with `status` and closes the store with it (the generation ends
  // or the coordinator shuts down).
  void Abort(const absl::Status& status, Actions& actions);

  // Whether a reported failure of the checkpoint at `step` is the first report of it: every
  // rank whose part of a save failed reports it (rank 0 too when only its commit failed), and
  // the job gets one CHECKPOINT_FAILED event per checkpoint. A generation saves at increasing
  // steps, so a step at or below the newest one reported is a repeat.
  bool FirstReportOfFailedCheckpoint(int64_t step) {
    if (step <= last_failed_checkpoint_step_) return false;
    last_failed_checkpoint_step_ = step;
    return true;
  }

  // Whether the member has yet to attach to this restored generation again.
  bool AwaitingReattach(const std::string& worker_id) const {
    return awaiting_reattach_.contains(worker_id);
  }
  // The member attached again; true once every member has.
  bool MarkReattached(const std::string& worker_id) {
    awaiting_reattach_.erase(worker_id);
    return awaiting_reattach_.empty();
  }
  // Members that have not attached again, in rank order (empty unless restored).
  std::vector<std::string> NotReattached() const;

  // A step advanced: the stall clock restarts.
  void MarkProgress(absl::Time now) { last_progress_time_ = now; }
  // The liveness view of this generation for CheckLiveness.
  GenerationView View(const std::string& job_id, const weft::v1::Job& job) const;

 private:
  struct JoinWaiter {
    std::shared_ptr<JoinCall> call;
    bool include_peers = false;
  };

  int64_t number_ = 0;
  std::vector<std::string> members_;  // rank order
  absl::flat_hash_map<std::string, int32_t> rank_of_;
  // By rank: position among the members on the same host, and how many those are.
  std::vector<int32_t> local_rank_;
  std::vector<int32_t> local_world_size_;
  absl::flat_hash_set<std::string> joined_;
  absl::flat_hash_map<std::string, std::string> data_errors_;  // only members that have one
  std::map<std::string, JoinWaiter> join_waiters_;
  bool rendezvous_complete_ = false;
  absl::Time start_time_;
  absl::Time last_progress_time_;
  std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
  int64_t last_failed_checkpoint_step_ = -1;
  absl::flat_hash_set<std::string> awaiting_reattach_;  // restored generations only
  absl::Time reattach_deadline_ = absl::InfiniteFuture();
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_RENDEZVOUS_H_
