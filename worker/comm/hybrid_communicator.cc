#include "worker/comm/hybrid_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace weft::comm {
namespace {

std::shared_ptr<Work> Unsupported(const char* op) {
  return MakeCompletedWork(absl::UnimplementedError(
      absl::StrCat(op, " over the whole world of a hybrid-sharded generation: use the group "
                       "or the replica communicator")));
}

}  // namespace

HybridCommunicator::HybridCommunicator(std::unique_ptr<Communicator> group,
                                       std::unique_ptr<Communicator> replica)
    : group_(std::move(group)), replica_(std::move(replica)) {}

int HybridCommunicator::rank() const {
  return replica_->rank() * group_->world_size() + group_->rank();
}

int HybridCommunicator::world_size() const {
  return group_->world_size() * replica_->world_size();
}

std::shared_ptr<Work> HybridCommunicator::AllGather(const void*, void*, size_t, DataType) {
  return Unsupported("AllGather");
}

std::shared_ptr<Work> HybridCommunicator::ReduceScatter(const void*, void*, size_t, DataType) {
  return Unsupported("ReduceScatter");
}

std::shared_ptr<Work> HybridCommunicator::Broadcast(void*, size_t, DataType, int) {
  return Unsupported("Broadcast");
}

std::shared_ptr<Work> HybridCommunicator::Reduce(const void*, void*, size_t, DataType, int) {
  return Unsupported("Reduce");
}

std::shared_ptr<Work> HybridCommunicator::AllReduce(void* buf, size_t count, DataType type) {
  if (absl::Status s = group_->AllReduce(buf, count, type)->Wait(); !s.ok()) {
    return MakeCompletedWork(std::move(s));
  }
  return replica_->AllReduce(buf, count, type);
}

std::shared_ptr<Work> HybridCommunicator::Barrier() {
  if (absl::Status s = group_->Barrier()->Wait(); !s.ok()) return MakeCompletedWork(std::move(s));
  return replica_->Barrier();
}

void HybridCommunicator::Abort(absl::Status reason) {
  group_->Abort(reason);
  replica_->Abort(std::move(reason));
}

}  // namespace weft::comm
