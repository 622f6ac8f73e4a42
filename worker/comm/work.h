// What the backends share about the ops they run: their kinds, and a Work completed once by
// whoever runs the op (a backend's communication thread).
#ifndef WEFT_WORKER_COMM_WORK_H_
#define WEFT_WORKER_COMM_WORK_H_

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"

namespace weft::comm {

// The collectives a backend queues.
enum class OpKind {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllToAll,
  kBarrier
};
// The Communicator method's name ("AllGather", ...), for messages.
const char* OpName(OpKind kind);
// Whether the op sums (and so needs a floating-point type).
bool Sums(OpKind kind);

// What one rank of `world` sends for an op of `count` elements of `element_bytes` (the
// Communicator method's count), as a ring sends it: (world - 1) blocks of an all-gather,
// reduce-scatter or all-to-all; (world - 1) / world of the data for a broadcast or reduce,
// twice that for an all-reduce. 0 at world 1.
int64_t RingSentBytes(OpKind kind, size_t count, size_t element_bytes, int world);

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes);

class CompletionWork final : public Work {
 public:
  absl::Status Wait() override;
  bool IsCompleted() override;

  // Sets the status and wakes waiters; false (and no effect) if already completed.
  bool Complete(absl::Status status);

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weft::comm

#endif  // WEFT_WORKER_COMM_WORK_H_
