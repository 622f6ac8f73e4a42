// The world of a hybrid-sharded generation (worker/zero/sharding_groups.h) seen through its two
// communicators: the rank's group (S ranks) and its replica (the R ranks at the same position
// in every group). There is no world communicator: on GPUs every NCCL communicator costs
// device memory, and over Gloo a world mesh is W^2 connections where the two take S^2 + R^2.
// What the generation run needs of the world is small: one-value all-reduces (restore and
// import votes, the checkpoint decision) and the last barrier; those are composed here.
//
// AllReduce sums over the group, then over the replica: every rank gets the world's sum. It
// blocks the caller until the group's part is done and returns the replica's Work; so calls
// stay in order on both communicators. Barrier: the group's, then the replica's — a rank
// leaves once every group (each has a member in its replica) has entered. AllGather,
// ReduceScatter, Broadcast, Reduce and AllToAll over the world are UNIMPLEMENTED: the engines
// use the two communicators directly. Abort aborts both.
#ifndef WEFT_WORKER_COMM_HYBRID_COMMUNICATOR_H_
#define WEFT_WORKER_COMM_HYBRID_COMMUNICATOR_H_

#include <memory>

#include "worker/comm/communicator.h"

namespace weft::comm {

class HybridCommunicator final : public Communicator {
 public:
  // Rank group_rank of `group` and group index replica_rank of `replica`: rank
  // replica_rank * group->world_size() + group_rank of the world.
  HybridCommunicator(std::unique_ptr<Communicator> group, std::unique_ptr<Communicator> replica);
  // The replica, then the group, each closing its own connections.
  ~HybridCommunicator() override = default;

  Communicator* group() const { return group_.get(); }
  Communicator* replica() const { return replica_.get(); }

  int rank() const override;
  int world_size() const override;
  std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t count_per_rank,
                                  DataType type) override;
  std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t count_per_rank,
                                      DataType type) override;
  std::shared_ptr<Work> AllReduce(void* buf, size_t count, DataType type) override;
  std::shared_ptr<Work> Broadcast(void* buf, size_t count, DataType type, int root) override;
  std::shared_ptr<Work> Reduce(const void* send, void* recv, size_t count, DataType type,
                               int root) override;
  std::shared_ptr<Work> Barrier() override;
  // The group's and the replica's.
  int64_t sent_bytes() const override { return group_->sent_bytes() + replica_->sent_bytes(); }
  void Abort(absl::Status reason) override;

 private:
  // Declared first, destroyed last.
  std::unique_ptr<Communicator> group_;
  std::unique_ptr<Communicator> replica_;
};

}  // namespace weft::comm

#endif  // WEFT_WORKER_COMM_HYBRID_COMMUNICATOR_H_
