// The device a worker trains on, as the pair a generation run needs: a communicator and the
// ZeRO engine that runs over it. The CPU pairs Gloo with ZeroCpuEngine; CUDA pairs NCCL with
// ZeroCudaEngine. Only this file's implementation knows which devices this build supports.
// With hybrid sharding (worker/zero/sharding_groups.h) a backend connects two communicators, the
// rank's group and its replica, and `comm` is their HybridCommunicator (the world's scalar
// all-reduces and barriers, and Abort of both); the engine runs over the two.
#ifndef WEFT_WORKER_DEVICE_BACKEND_H_
#define WEFT_WORKER_DEVICE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/store.h"
#include "worker/comm/communicator.h"
#include "worker/zero/sharding_groups.h"
#include "worker/zero/training_engine.h"
#include "weft/v1/job.pb.h"

namespace weft::worker {

struct DeviceOptions {
  // CUDA device this worker trains on; -1: the CPU.
  int cuda_device = -1;
  // Address other ranks reach this worker at (the Gloo listening address).
  std::string data_address = "127.0.0.1";
  // A collective (or the communicator's connection setup) not done by then fails.
  int64_t collective_timeout_ms = 60000;
  // The generation's ranks on this worker's host (JoinResponse.local_world_size), which share
  // its memory: the CPU engine's memory plan gets a share of the host's available memory, and
  // the GPU engine's optimizer offload checks the host holds all of theirs.
  int ranks_on_host = 1;
};

struct DeviceBackend {
  // The world (AllReduce, Barrier, Abort for the generation run). Declared before the engine,
  // which uses it (or the communicators it owns): the engine is destroyed first.
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<zero::TrainingEngine> engine;
  // What the engine shards over (the world, or the rank's group) and, with hybrid groups, the
  // replica; both owned by `comm`. For the traffic metrics.
  const comm::Communicator* shards = nullptr;
  const comm::Communicator* replica = nullptr;
};

// Called between the communicators and the engine, for sharding.scope AUTO to settle the spec
// the engine is built from: with `world` (the backend's comm) and, with hybrid groups, the
// bus bandwidth in Gb/s of an all-reduce over the replica (timed then, the same on every rank:
// the mean of the ranks'), 0 without. An error fails the backend as the engine's would.
using BeforeEngine = std::function<absl::StatusOr<weft::v1::JobSpec>(
    comm::Communicator& world, double replica_busbw_gbps)>;

// Which part of a backend could not be made. The communicator fails when a peer or the
// rendezvous does (often transient); the engine fails on what the job asks of this device.
enum class BackendPart { kCommunicator, kEngine };

// Connects rank `rank` of `groups.world` through `store` (the generation's store) and builds the
// engine for `spec` over that communicator, or with hybrid groups over the rank's group and
// replica (rendezvousing under "<backend>/group/<g>" and "<backend>/replica/<position>"). On
// failure, `*failed` (when not null) says which part.
absl::StatusOr<DeviceBackend> CreateDeviceBackend(const DeviceOptions& options, Store* store,
                                                  int rank, const zero::ShardingGroups& groups,
                                                  const weft::v1::JobSpec& spec,
                                                  BackendPart* failed = nullptr,
                                                  const BeforeEngine& before_engine = nullptr);

// Whether a rank of `spec` on this device, in a group of `group_size` ranks with `replicas`
// replicas, fits its memory now: the engine's own test (ZeroCudaEngine::CheckFits,
// ZeroCpuEngine::CheckFits), local to this rank.
absl::Status CheckShardedStateFits(const DeviceOptions& options, const weft::v1::JobSpec& spec,
                                   int group_size, int replicas);

}  // namespace weft::worker

#endif  // WEFT_WORKER_DEVICE_BACKEND_H_
