// Blocking C++ client of the weft.v1.Checkpoint service (weft-checkpointd): what workers,
// trainctl, benchmarks and tests use instead of raw stubs, so that chunking, checksums,
// deadlines and error conversion are decided once.
//
// Every call returns absl::Status(Or); a gRPC failure keeps its canonical code and the
// daemon's message (see checkpoint.proto for what each code means). The one addition: when
// the daemon cannot be reached at all (UNAVAILABLE or DEADLINE_EXCEEDED while the channel is
// not connected), the message names the checkpointd address, because gRPC's own text does not
// tell a user which flag was wrong. Arguments the daemon would refuse anyway (negative step,
// rank outside the world, a range past the tensor) are refused here with INVALID_ARGUMENT
// before anything is sent, so a worker never streams gigabytes only to be told at the end.
//
// Deadlines: every unary call must finish within rpc_timeout of its start; a stream (a shard
// written, a range read) within rpc_timeout plus its bytes at 20 MB/s, so large shards are
// never cut short on a working link while a stalled stream still ends.
//
// Thread-safe: calls may run concurrently from any number of threads on one client (one
// channel; gRPC multiplexes). Concurrent writers of big shards get more bandwidth from one
// client each, since each client has its own TCP connection.
#ifndef WEFT_CLIENT_CHECKPOINT_CLIENT_H_
#define WEFT_CLIENT_CHECKPOINT_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/rpc_call.h"
#include "grpcpp/channel.h"
#include "weft/v1/checkpoint.grpc.pb.h"

namespace weft {

// One tensor's part held by this rank.
struct ShardTensor {
  std::string name;  // 1-512 bytes, no '/'
  weft::v1::DType dtype = weft::v1::DTYPE_F32;
  std::vector<int64_t> shape;  // the GLOBAL shape of the whole tensor
  int64_t begin = 0, end = 0;  // this rank's global flat element range [begin, end)
  const void* data = nullptr;  // (end - begin) elements, little-endian
};

// Bytes per element of `dtype`; 0 for DTYPE_UNSPECIFIED or an unknown value.
int DTypeSize(weft::v1::DType dtype);

// Elements of a tensor of global `shape` (1 for a scalar); -1 if a dimension is < 1 or the
// product overflows.
int64_t NumElements(const std::vector<int64_t>& shape);

// Largest chunk the daemon accepts and sends (checkpoint.proto): 4 MiB of data.
inline constexpr size_t kMaxCheckpointChunkBytes = 4 << 20;

class CheckpointClient {
 public:
  // Dials `address` ("host:port") over a private connection. Never fails here: an
  // unreachable daemon shows up as UNAVAILABLE (naming `address`) on the first call.
  //
  // Every call that finds the daemon unreachable waits up to min(rpc_timeout,
  // reconnect_wait) for it to come back before it is sent (client/rpc_call.h RunAttempts),
  // and WriteShard, List, GetManifest, ReadRange and SetPinned, safe to send twice, go again
  // after an UNAVAILABLE failure. So a connection attempt lost on a loaded machine, or a
  // daemon restarted within the wait, costs a delay and not the call. The default wait covers
  // a hiccup and a quick restart while still reporting a daemon that is down (a worker's
  // checkpoint becomes a CHECKPOINT_FAILED event) within seconds. Delete is sent at most
  // once: a repeat of one that did land would be refused. So is Commit, which settles a lost
  // answer by reading back (see Commit).
  explicit CheckpointClient(const std::string& address,
                            absl::Duration rpc_timeout = absl::Seconds(60),
                            absl::Duration reconnect_wait = absl::Seconds(3));

  // Streams one rank's shard of checkpoint (job_id, step): a header listing every tensor's
  // layout and each non-empty range in `tensors` order, then each range's data in chunks of
  // at most `chunk_bytes` (rounded down to whole elements, at least one element, at most
  // 4 MiB), each with its CRC32C. Tensors with begin == end are listed as layouts only (a
  // rank may hold nothing). Invisible until Commit. Returns the tensor bytes the daemon
  // stored. INVALID_ARGUMENT before sending anything if an argument is bad; DATA_LOSS if the
  // daemon saw a chunk whose checksum does not match (memory or wire corruption: retry).
  absl::StatusOr<int64_t> WriteShard(const std::string& job_id, int64_t step, int32_t rank,
                                     int32_t world_size, const std::vector<ShardTensor>& tensors,
                                     size_t chunk_bytes = kMaxCheckpointChunkBytes);

  // The commit point: FAILED_PRECONDITION naming the missing ranks if some shard is not in,
  // ALREADY_EXISTS if the step is committed already. When the connection is lost (the answer
  // may be lost after the commit point), the step's manifest is read back: committed with
  // this world size and optimizer step, the commit landed (OK); not committed, the commit is
  // sent once more. A lost answer then costs a read, not the checkpoint.
  absl::Status Commit(const weft::v1::CheckpointManifest& manifest);

  // Committed checkpoints of `job_id`, newest first (empty for an unknown job).
  absl::StatusOr<std::vector<weft::v1::CheckpointManifest>> List(const std::string& job_id);

  // The manifest at `step`; 0 = the latest. NOT_FOUND if there is none.
  absl::StatusOr<weft::v1::CheckpointManifest> GetManifest(const std::string& job_id,
                                                           int64_t step = 0);

  // Reads elements [begin, end) of `tensor` of checkpoint (job_id, step) (step 0: the latest)
  // into `out`, which must hold (end - begin) * DTypeSize(tensor's dtype) bytes, whatever
  // world size wrote it. The dtype comes from the manifest (fetched once per committed step
  // and cached). Every chunk's CRC32C is verified: DATA_LOSS naming the tensor otherwise, as
  // for a stream that does not cover the range exactly. OUT_OF_RANGE for a range past the
  // tensor, NOT_FOUND for an unknown checkpoint or tensor. On error `out` is partly written.
  absl::Status ReadRange(const std::string& job_id, int64_t step, const std::string& tensor,
                         int64_t begin, int64_t end, void* out);

  // Pins (exempt from keep-last retention) or unpins a committed checkpoint. NOT_FOUND if
  // there is no committed checkpoint at exactly `step`.
  absl::Status SetPinned(const std::string& job_id, int64_t step, bool pinned);

  // Removes a committed checkpoint. NOT_FOUND if none, FAILED_PRECONDITION if pinned.
  absl::Status Delete(const std::string& job_id, int64_t step);

  const std::string& address() const { return address_; }

  // Whether the channel to the daemon is not connected but trying (TRANSIENT_FAILURE or
  // CONNECTING): a call that has been in flight for a while is then waiting for a daemon that
  // is not there, not for a slow one. Starts no connection attempt.
  bool Unreachable() const;

 private:
  // The step `step` names (0: the latest committed one, resolved once so that the read that
  // follows cannot straddle a concurrent commit) and the dtype of `tensor` in it.
  absl::StatusOr<std::pair<int64_t, weft::v1::DType>> ResolveTensor(const std::string& job_id,
                                                                    int64_t step,
                                                                    const std::string& tensor);

  std::string address_;
  absl::Duration rpc_timeout_;
  // Reads, shard writes and pins repeat; Commit and Delete are sent once (Commit then reads
  // back).
  const ReconnectPolicies reconnect_;
  ServerName server_;
  std::unique_ptr<weft::v1::Checkpoint::Stub> stub_;

  // Tensor dtypes of committed checkpoints, keyed by (job, step). A committed checkpoint
  // never changes its tensors, so entries stay right; a delete-then-rewrite of the same step
  // by someone else is still caught by ReadRange's size checks.
  absl::Mutex mu_;
  std::map<std::pair<std::string, int64_t>, std::map<std::string, weft::v1::DType>> dtypes_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace weft

#endif  // WEFT_CLIENT_CHECKPOINT_CLIENT_H_
