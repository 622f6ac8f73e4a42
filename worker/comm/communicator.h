// The collective-communication interface of the training engine, in the spirit of c10d's
// Backend: every collective is enqueued and returns a Work handle; a backend implements what
// it supports and answers UNIMPLEMENTED (saying what it lacks) otherwise.
//
// Implementations, both rendezvousing through the generation's weft::Store (never a file store
// or a separate TCP store):
//   - Gloo over TCP (CPU): CreateGlooCommunicator, below (gloo_communicator.cc).
//   - NCCL (GPU, one device per rank): CreateNcclCommunicator, nccl_communicator.h, which adds
//     the CUDA stream the collectives run on and an event wait (CudaCommunicator).
//
// Ordering: the collectives of one Communicator form a single stream of ops, executed in call
// order, so a caller may enqueue the next unit's AllGather and compute while it runs (ZeRO
// prefetch). Where they execute is the backend's: Gloo queues them to one communication thread
// per communicator; NCCL enqueues them on the caller's thread onto the communicator's CUDA
// stream (NCCL's own threads do the networking), and a Work polls an event recorded behind
// the op. Every rank must enqueue the same sequence of collectives with the same counts, types
// and roots.
//
// Errors: a Work's status is the op's outcome.
//   - ABORTED (or the code of the status given to Abort): the communicator was aborted.
//   - DEADLINE_EXCEEDED: the op (or connection setup) ran past the backend's timeout_ms
//     (GlooOptions, NcclOptions).
//   - UNAVAILABLE: a peer's connection was lost (the peer died, failed or aborted); Gloo names
//     the ranks whose connections failed.
//   - UNIMPLEMENTED: the backend does not support the data type or op.
//   - INVALID_ARGUMENT: bad arguments (null buffer, root out of range, count too large).
// After a failed op the communicator is broken (the ranks' streams are out of step): every
// later op fails at once with the first failure's code. A new generation needs a new
// communicator. Destroying a communicator never hangs, even when peers have vanished; the
// Works of ops that never finished complete with CANCELLED.
#ifndef WEFT_WORKER_COMM_COMMUNICATOR_H_
#define WEFT_WORKER_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/store.h"

namespace weft::comm {

// kUInt8 is opaque bytes (an encoded payload, worker/comm/wire_codec.h): data movement only
// (AllGather, AllToAll, Broadcast); the sums refuse it (UNIMPLEMENTED).
enum class DataType { kFloat32, kBFloat16, kUInt8 };

// "float32" / "bfloat16" / "uint8".
std::string_view DataTypeName(DataType type);
// Bytes per element: 4 / 2 / 1.
size_t DataTypeSize(DataType type);

// Handle of one enqueued collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the op is done; returns its status. May be called any number of times, from
  // any thread.
  virtual absl::Status Wait() = 0;
  // Whether the op is done (Wait would not block).
  virtual bool IsCompleted() = 0;
};

// A Work that is already done with `status` (for ops that fail validation, and for tests).
std::shared_ptr<Work> MakeCompletedWork(absl::Status status);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // All collectives are enqueued in call order and executed in that order (one stream of
  // ops), asynchronously. Buffers must stay valid (and `send` unmodified) until the Work
  // completes, and must not overlap except where an op says so. A count of 0 completes at
  // once with OK. Argument errors (INVALID_ARGUMENT) and unsupported types (UNIMPLEMENTED)
  // come back as an already completed Work and do not break the communicator.

  // recv (world*count elements): rank r's `send` block at r*count. `send` may alias
  // recv + rank*count (in place).
  virtual std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t count_per_rank,
                                          DataType type) = 0;
  // SUM. send: world*count elements; recv: count elements — rank r gets the sum of every
  // rank's block r. `send` is not modified, except in place: `recv` may be send + rank*count,
  // and then only that block of it changes.
  virtual std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t count_per_rank,
                                              DataType type) = 0;
  // SUM, in place.
  virtual std::shared_ptr<Work> AllReduce(void* buf, size_t count, DataType type) = 0;
  // Root's `buf` is copied into every rank's `buf`.
  virtual std::shared_ptr<Work> Broadcast(void* buf, size_t count, DataType type, int root) = 0;
  // SUM into one rank: root's `recv` (count elements) gets the sum of every rank's `send`. Only
  // the root's `recv` is written; other ranks may pass null. `send` is not modified, and on
  // the root may be `recv` itself (in place).
  virtual std::shared_ptr<Work> Reduce(const void* send, void* recv, size_t count, DataType type,
                                       int root) = 0;
  virtual std::shared_ptr<Work> Barrier() = 0;
  // send and recv: world*count elements each, apart. Rank r's recv block q is rank q's send
  // block r. Backends without it answer UNIMPLEMENTED (the default).
  virtual std::shared_ptr<Work> AllToAll(const void* send, void* recv, size_t count_per_rank,
                                         DataType type);

  // Bytes this rank's collectives have sent since the communicator was made, counted when
  // they are enqueued as ring algorithms send them (RingSentBytes, work.h): what the job's
  // schedule asks of the links, for the intra/inter-host metrics. 0 for a backend that does
  // not count.
  virtual int64_t sent_bytes() const { return 0; }

  // Fails every in-flight and queued op promptly (well under a second) with `reason` (OK is
  // replaced by ABORTED) and every later op too. Gloo also fails its connections, so peers
  // fail promptly as well; NCCL peers blocked on this rank fail at their own timeout or Abort
  // (nccl_communicator.h). Thread-safe, idempotent (the first reason wins); callable from any
  // thread while the communicator exists (the worker's heartbeat thread calls it when the
  // coordinator says the generation ended).
  virtual void Abort(absl::Status reason) = 0;
};

struct GlooOptions {
  // Address this rank listens on (the worker passes its host's address).
  std::string hostname = "127.0.0.1";
  // Limit for every collective and for the connection setup (store waits included).
  int64_t timeout_ms = 30000;
  // Namespace of the rendezvous keys in the store; two communicators sharing one store need
  // different prefixes.
  std::string store_prefix = "gloo";
  // AllReduce and ReduceScatter run Gloo's algorithms on pieces of at most this many bytes
  // (for ReduceScatter: all ranks' blocks together), which bounds their scratch memory (1-3x
  // a piece) and keeps Gloo's 32-bit element counts in range. Every rank must use the same
  // value (results depend on it, bit for bit).
  int64_t chunk_bytes = int64_t{64} << 20;
};

// Rendezvous through `store` (the generation's store; keys under "<store_prefix>/"), then a
// full mesh of TCP connections. `store` is used only during this call. World size 1 makes no
// connections (store may be null): collectives are local copies. Blocks until every rank has
// connected; DEADLINE_EXCEEDED after timeout_ms, ABORTED if the store's generation ends
// meanwhile. Sets SIGPIPE to ignored if it has its default action (a peer's reset socket
// must not kill the process).
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store* store, int rank,
                                                                     int world_size,
                                                                     const GlooOptions& options);

}  // namespace weft::comm

#endif  // WEFT_WORKER_COMM_COMMUNICATOR_H_
