// Several ranks of this process on ONE GPU as CudaCommunicators with NCCL's stream semantics,
// which NCCL itself refuses (one device per rank). For testing the GPU engine's world > 1 code
// on a one-GPU machine, the only kind most test machines have.
//
// What it keeps of NCCL: every collective is enqueued, not done, when the call returns. It runs
// on the GPU after the work already on the rank's stream() and before the work enqueued there
// later, and reads its inputs and writes its outputs then; the host never waits. A caller that
// forgets an event between its compute stream and stream() is then racing the collective, as it
// would be with NCCL.
//
// What it adds: `late_us` holds every collective back on the GPU after its inputs are ready (a
// one-thread kernel spinning on the GPU's timer ahead of it), so compute that does not wait
// for it runs first, and a missed wait shows as wrong values rather than as a race NCCL on
// fast links usually wins. With `synchronous` the call returns
// only once the collective is done (StagedCudaCommunicator's behaviour): the reference a late
// run must match bit for bit, since both sum in the same order.
//
// How: the ranks of a group meet on the host at each collective (all must call the same ops in
// the same order, as with NCCL); the last to arrive enqueues the collective on the group's own
// stream, behind every rank's ready event, and every rank's stream() then waits for it. Sums are
// fp32 in a fixed order (engine/cuda/reduce.h); gathers and broadcasts copy bytes. Device
// buffers only.
#ifndef WEFT_TESTS_WORKER_COMM_IN_PROCESS_CUDA_COMMUNICATOR_H_
#define WEFT_TESTS_WORKER_COMM_IN_PROCESS_CUDA_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/nccl_communicator.h"

namespace weft::comm::testing {

struct InProcessOptions {
  // How long each collective waits on the GPU, after every rank's inputs are ready, before it
  // reads them. 0: at once.
  int64_t late_us = 0;
  // Each call returns only once its collective is done on the GPU.
  bool synchronous = false;
  // Limit for the host meeting of each collective and for WaitEvent (DEADLINE_EXCEEDED).
  int64_t timeout_ms = 60000;
};

// Rank `rank` of the group `name` of `size` ranks (at most 8), on the current CUDA device. The
// group exists while any of its communicators does; its ranks must use the same options.
absl::StatusOr<std::unique_ptr<CudaCommunicator>> CreateInProcessCudaCommunicator(
    const std::string& name, int rank, int size, const InProcessOptions& options);

}  // namespace weft::comm::testing

#endif  // WEFT_TESTS_WORKER_COMM_IN_PROCESS_CUDA_COMMUNICATOR_H_
