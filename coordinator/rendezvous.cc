#include "coordinator/rendezvous.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace weft::coordinator {

Generation::Generation(int64_t number, std::vector<std::string> members,
                       const std::function<std::string(const std::string&)>& host_of,
                       absl::Time now)
    : number_(number), members_(std::move(members)), start_time_(now), last_progress_time_(now) {
  const int32_t world = world_size();
  absl::flat_hash_map<std::string, int32_t> per_host;
  local_rank_.resize(world);
  local_world_size_.resize(world);
  std::vector<std::string> hosts;
  for (int32_t rank = 0; rank < world; ++rank) {
    rank_of_[members_[rank]] = rank;
    hosts.push_back(host_of(members_[rank]));
    local_rank_[rank] = per_host[hosts.back()]++;
  }
  for (int32_t rank = 0; rank < world; ++rank) local_world_size_[rank] = per_host[hosts[rank]];
}

Generation Generation::Restored(int64_t number, std::vector<std::string> members,
                                std::shared_ptr<MemoryStore> store, absl::Time now,
                                absl::Time reattach_deadline) {
  Generation gen(number, std::move(members), [](const std::string&) { return std::string(); },
                 now);
  gen.rendezvous_complete_ = true;
  gen.joined_.insert(gen.members_.begin(), gen.members_.end());
  gen.awaiting_reattach_.insert(gen.members_.begin(), gen.members_.end());
  gen.reattach_deadline_ = reattach_deadline;
  gen.store_ = std::move(store);
  return gen;
}

std::vector<std::string> Generation::NotReattached() const {
  std::vector<std::string> missing;
  for (const auto& m : members_) {
    if (awaiting_reattach_.contains(m)) missing.push_back(m);
  }
  return missing;
}

int32_t Generation::RankOf(const std::string& worker_id) const {
  auto it = rank_of_.find(worker_id);
  return it == rank_of_.end() ? -1 : it->second;
}

bool Generation::MarkJoined(const std::string& worker_id, const std::string& data_error) {
  joined_.insert(worker_id);
  if (data_error.empty()) {
    data_errors_.erase(worker_id);
  } else {
    data_errors_[worker_id] = data_error;
  }
  return joined_.size() == members_.size();
}

const std::string& Generation::DataError(const std::string& worker_id) const {
  static const std::string* const kNone = new std::string;
  auto it = data_errors_.find(worker_id);
  return it == data_errors_.end() ? *kNone : it->second;
}

std::vector<std::string> Generation::NotJoined() const {
  std::vector<std::string> missing;
  for (const auto& m : members_) {
    if (!joined_.contains(m)) missing.push_back(m);
  }
  return missing;
}

weft::v1::JoinResponse Generation::ResponseFor(int32_t rank, bool include_peers,
                                               const PeerInfo& peer) const {
  weft::v1::JoinResponse response;
  response.set_rank(rank);
  response.set_world_size(world_size());
  response.set_local_rank(local_rank_[rank]);
  response.set_local_world_size(local_world_size_[rank]);
  if (!include_peers) return response;
  for (size_t r = 0; r < members_.size(); ++r) {
    auto* p = response.add_peers();
    p->set_rank(static_cast<int32_t>(r));
    p->set_worker_id(members_[r]);
    if (const weft::v1::WorkerInfo* info = peer(members_[r])) {
      p->set_host(info->host());
      p->set_host_id(info->host_id());
      p->set_device_index(info->device_index());
      p->set_address(info->address());
    }
  }
  return response;
}

void Generation::ParkJoin(const std::string& worker_id, bool include_peers, DeadlineTimer& timer,
                          absl::Mutex* guard, absl::Time deadline, JoinCall::Done done,
                          JoinCall::Expiry expire, Actions& actions) {
  if (auto old = join_waiters_.find(worker_id); old != join_waiters_.end()) {
    old->second.call->AnswerLater(
        actions, absl::CancelledError("superseded by a newer Join from the same worker"));
    join_waiters_.erase(old);
  }
  join_waiters_[worker_id] = {
      JoinCall::Park(timer, guard, deadline, std::move(done), std::move(expire)), include_peers};
}

absl::Status Generation::ExpireJoin(const std::string& worker_id, const JoinCall& call) {
  if (auto it = join_waiters_.find(worker_id);
      it != join_waiters_.end() && it->second.call.get() == &call) {
    join_waiters_.erase(it);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "rendezvous of generation ", number_, " incomplete: ", joined_.size(), " of ",
      members_.size(), " joined; waiting for ", absl::StrJoin(NotJoined(), ", ")));
}

absl::Duration Generation::CompleteRendezvous(absl::Time now, const PeerInfo& peer,
                                              Actions& actions) {
  rendezvous_complete_ = true;
  last_progress_time_ = now;
  for (auto& [worker_id, waiter] : join_waiters_) {
    waiter.call->AnswerLater(actions,
                             ResponseFor(rank_of_.at(worker_id), waiter.include_peers, peer));
  }
  join_waiters_.clear();
  return now - start_time_;
}

void Generation::Abort(const absl::Status& status, Actions& actions) {
  for (auto& [worker_id, waiter] : join_waiters_) waiter.call->AnswerLater(actions, status);
  join_waiters_.clear();
  actions.Add([store = store_, status] { store->Close(status); });
}

GenerationView Generation::View(const std::string& job_id, const weft::v1::Job& job) const {
  GenerationView view;
  view.job_id = job_id;
  view.generation = number_;
  view.start_time = start_time_;
  if (!rendezvous_complete_) view.not_joined = NotJoined();
  view.not_reattached = NotReattached();
  view.reattach_deadline = reattach_deadline_;
  view.last_progress_time = last_progress_time_;
  view.step = job.status().step();
  view.heartbeat_timeout_ms = job.spec().fault().heartbeat_timeout_ms();
  view.stall_timeout_ms = job.spec().fault().stall_timeout_ms();
  return view;
}

}  // namespace weft::coordinator
