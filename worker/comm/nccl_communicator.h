// The NCCL backend of the Communicator interface (GPU, one device per rank).
//
// Rendezvous: rank 0 creates the NCCL unique id and publishes it in the generation's
// weft::Store under "<store_prefix>/unique_id"; the other ranks wait for it there. No
// TCPStore, no MPI, no SSH: the coordinator's store is the only meeting point.
//
// Streams: every collective runs on the communicator's own CUDA stream (stream()), in call
// order. Buffers may be DEVICE memory (the fast path: nothing but the NCCL call is enqueued)
// or HOST memory (staged through a device buffer and copied back before the Work completes;
// for small control values such as a loss or a vote). A device-buffer caller orders the
// collective after its own compute with events:
//   cudaEventRecord(ready, compute); cudaStreamWaitEvent(comm->stream(), ready);
//   comm->ReduceScatter(...);  cudaEventRecord(done, comm->stream());
//   cudaStreamWaitEvent(compute, done);
// so the host never blocks; Work::Wait (and WaitEvent) block the host with abort and timeout
// checks. One exception: NCCL connects ranks lazily, on the first use of each algorithm, and
// that first enqueue call returns only once every peer has entered the same op (bounded by
// Abort and timeout_ms, which then fail it like a Work). Later ops enqueue at once.
//
// Failure: the communicator is created non-blocking (ncclConfig_t::blocking = 0), so init
// and every wait can be abandoned. Abort (from any thread), a NCCL asynchronous error or a
// wait longer than timeout_ms calls ncclCommAbort, which makes the in-flight kernels of this
// rank return; peers blocked on this rank see their own timeout or their own Abort (the worker
// aborts when the coordinator ends the generation). After that every op fails at once.
#ifndef WEFT_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define WEFT_WORKER_COMM_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/store.h"
#include "worker/comm/communicator.h"

namespace weft::comm {

struct NcclOptions {
  // CUDA device of this rank (cudaSetDevice is called on it by Create and by the threads the
  // communicator starts).
  int device = 0;
  // Limit for init (store wait included) and for each host-side wait (Work::Wait, WaitEvent).
  int64_t timeout_ms = 60000;
  // Namespace of the rendezvous keys in the store.
  std::string store_prefix = "nccl";
};

class CudaCommunicator : public Communicator {
 public:
  // The stream the collectives run on.
  virtual cudaStream_t stream() const = 0;
  // Blocks the host until `event` completes, polling; fails (and aborts the communicator)
  // on Abort, a NCCL asynchronous error, or after timeout_ms (DEADLINE_EXCEEDED). The GPU
  // engine's only host synchronisation goes through here, so a dead peer can never hold a
  // rank longer than the timeout or the coordinator's abort.
  virtual absl::Status WaitEvent(cudaEvent_t event) = 0;
  // The first failure (OK while healthy).
  virtual absl::Status health() = 0;
};

// World size 1 is a valid NCCL communicator (collectives are local copies); `store` may then
// be null.
absl::StatusOr<std::unique_ptr<CudaCommunicator>> CreateNcclCommunicator(
    Store* store, int rank, int world_size, const NcclOptions& options);

}  // namespace weft::comm

#endif  // WEFT_WORKER_COMM_NCCL_COMMUNICATOR_H_
