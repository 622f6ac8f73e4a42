// Shared pieces of the Communicator interface: data type helpers and the completion Work.
#include "worker/comm/work.h"

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>

#include "worker/comm/communicator.h"

namespace weft::comm {

std::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 4;
    case DataType::kBFloat16:
      return 2;
    case DataType::kUInt8:
      return 1;
  }
  return 0;
}

absl::Status CompletionWork::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

bool CompletionWork::IsCompleted() {
  absl::MutexLock lock(&mu_);
  return done_;
}

bool CompletionWork::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return false;
  status_ = std::move(status);
  done_ = true;
  return true;
}

std::shared_ptr<Work> MakeCompletedWork(absl::Status status) {
  auto work = std::make_shared<CompletionWork>();
  work->Complete(std::move(status));
  return work;
}

const char* OpName(OpKind kind) {
  // In OpKind's order; kBarrier is the last kind.
  static constexpr const char* kNames[] = {"AllGather", "ReduceScatter", "AllReduce", "Broadcast",
                                           "Reduce",    "AllToAll",      "Barrier"};
  static_assert(std::size(kNames) == static_cast<size_t>(OpKind::kBarrier) + 1);
  return kNames[static_cast<int>(kind)];
}

bool Sums(OpKind kind) {
  return kind == OpKind::kReduceScatter || kind == OpKind::kAllReduce ||
         kind == OpKind::kReduce || kind == OpKind::kBarrier;
}

int64_t RingSentBytes(OpKind kind, size_t count, size_t element_bytes, int world) {
  if (world <= 1) return 0;
  const double bytes = static_cast<double>(count) * static_cast<double>(element_bytes);
  const double others = world - 1;
  switch (kind) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
      return static_cast<int64_t>(bytes * others);
    case OpKind::kAllReduce:
    case OpKind::kBarrier:
      return static_cast<int64_t>(2 * bytes * others / world);
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      return static_cast<int64_t>(bytes * others / world);
  }
  return 0;
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

std::shared_ptr<Work> Communicator::AllToAll(const void*, void*, size_t, DataType) {
  return MakeCompletedWork(
      absl::UnimplementedError("this communicator does not implement AllToAll"));
}

}  // namespace weft::comm
