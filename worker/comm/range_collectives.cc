#include "worker/comm/range_collectives.h"

#include <algorithm>
#include <utility>

namespace weft::comm {
namespace {

// Done when all of its ops are; its status is the first failure in enqueue order.
class AllOfWork final : public Work {
 public:
  explicit AllOfWork(std::vector<std::shared_ptr<Work>> ops) : ops_(std::move(ops)) {}
  absl::Status Wait() override {
    absl::Status first;
    for (const auto& op : ops_) first.Update(op->Wait());
    return first;
  }
  bool IsCompleted() override {
    return std::all_of(ops_.begin(), ops_.end(), [](const auto& op) { return op->IsCompleted(); });
  }

 private:
  const std::vector<std::shared_ptr<Work>> ops_;
};

std::shared_ptr<Work> AllOf(std::vector<std::shared_ptr<Work>> ops) {
  if (ops.size() == 1) return std::move(ops[0]);
  if (ops.empty()) return MakeCompletedWork(absl::OkStatus());
  return std::make_shared<AllOfWork>(std::move(ops));
}

}  // namespace

std::vector<RangePart> RangeParts(size_t begin, size_t end, size_t block, int world) {
  std::vector<RangePart> parts;
  if (block == 0 || begin >= end) return parts;
  for (int r = static_cast<int>(begin / block); r < world; ++r) {
    const size_t lo = std::max(begin, static_cast<size_t>(r) * block);
    const size_t hi = std::min(end, static_cast<size_t>(r + 1) * block);
    if (lo >= hi) break;
    parts.push_back({.rank = r, .offset = lo - begin, .count = hi - lo});
  }
  return parts;
}

RangePart OwnPart(size_t begin, size_t end, size_t block, int world, int rank) {
  for (const RangePart& part : RangeParts(begin, end, block, world)) {
    if (part.rank == rank) return part;
  }
  return {.rank = rank};
}

std::shared_ptr<Work> AllGatherRange(Communicator& comm, void* recv, size_t begin, size_t end,
                                     size_t block, DataType type) {
  const size_t elem = DataTypeSize(type);
  std::vector<std::shared_ptr<Work>> ops;
  for (const RangePart& part : RangeParts(begin, end, block, comm.world_size())) {
    ops.push_back(comm.Broadcast(static_cast<char*>(recv) + part.offset * elem, part.count, type,
                                 part.rank));
  }
  return AllOf(std::move(ops));
}

std::shared_ptr<Work> ReduceScatterRange(Communicator& comm, const void* send, void* recv,
                                         size_t begin, size_t end, size_t block, DataType type) {
  const size_t elem = DataTypeSize(type);
  std::vector<std::shared_ptr<Work>> ops;
  for (const RangePart& part : RangeParts(begin, end, block, comm.world_size())) {
    ops.push_back(comm.Reduce(static_cast<const char*>(send) + part.offset * elem,
                              part.rank == comm.rank() ? recv : nullptr, part.count, type,
                              part.rank));
  }
  return AllOf(std::move(ops));
}

}  // namespace weft::comm
