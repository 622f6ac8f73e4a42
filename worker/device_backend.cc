#include "worker/device_backend.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/comm/hybrid_communicator.h"
#include "worker/zero/zero_cpu.h"
#ifdef WEFT_WORKER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/comm/nccl_communicator.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/zero/zero_cuda.h"
#endif

namespace weft::worker {
namespace {

// A communicator of a world, or of part of one, rendezvousing under its own store prefix.
struct CommPart {
  std::string prefix;
  int rank = 0;
  int size = 1;
};

// The rank's group and replica under `base` (the backend's store prefix): every group and
// every replica meets under a prefix of its own.
CommPart GroupPart(const std::string& base, const zero::ShardingGroups& groups, int rank) {
  return {absl::StrCat(base, "/group/", groups.group(rank)), groups.position(rank),
          groups.group_size};
}
CommPart ReplicaPart(const std::string& base, const zero::ShardingGroups& groups, int rank) {
  return {absl::StrCat(base, "/replica/", groups.position(rank)), groups.group(rank),
          groups.replicas()};
}

// The communicators an engine runs over: the world's, or with hybrid groups the rank's group
// and replica, which the backend's comm then owns through a HybridCommunicator. Every rank
// connects its group first, then its replica: no rendezvous waits for a rank blocked in
// another.
template <typename Comm>
struct EngineComms {
  Comm* shards = nullptr;   // what the engine shards over
  Comm* replica = nullptr;  // null without hybrid sharding
};

template <typename Comm, typename Connect>
absl::StatusOr<EngineComms<Comm>> ConnectComms(const std::string& base, int rank,
                                               const zero::ShardingGroups& groups,
                                               const Connect& connect, DeviceBackend* backend) {
  EngineComms<Comm> comms;
  if (!groups.hybrid()) {
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<Comm> world, connect({base, rank, groups.world}));
    comms.shards = world.get();
    backend->comm = std::move(world);
    return comms;
  }
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<Comm> group, connect(GroupPart(base, groups, rank)));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<Comm> across, connect(ReplicaPart(base, groups, rank)));
  comms.shards = group.get();
  comms.replica = across.get();
  backend->comm = std::make_unique<comm::HybridCommunicator>(std::move(group), std::move(across));
  return comms;
}

absl::StatusOr<DeviceBackend> CreateCpuBackend(const DeviceOptions& options, Store* store,
                                               int rank, const zero::ShardingGroups& groups,
                                               const weft::v1::JobSpec& spec,
                                               BackendPart* failed) {
  comm::GlooOptions gloo_options;
  gloo_options.hostname = options.data_address;
  gloo_options.timeout_ms = options.collective_timeout_ms;
  auto connect = [&](const CommPart& part) {
    comm::GlooOptions part_options = gloo_options;
    part_options.store_prefix = part.prefix;
    return comm::CreateGlooCommunicator(store, part.rank, part.size, part_options);
  };
  *failed = BackendPart::kCommunicator;
  DeviceBackend backend;
  WEFT_ASSIGN_OR_RETURN(const EngineComms<comm::Communicator> comms,
                        ConnectComms<comm::Communicator>("gloo", rank, groups, connect, &backend));
  *failed = BackendPart::kEngine;
  WEFT_ASSIGN_OR_RETURN(backend.engine,
                        zero::ZeroCpuEngine::Create(spec, comms.shards, comms.replica,
                                              zero::ZeroCpuOptions{options.ranks_on_host}));
  return backend;
}

absl::StatusOr<DeviceBackend> CreateCudaBackend(const DeviceOptions& options, Store* store,
                                                int rank, const zero::ShardingGroups& groups,
                                                const weft::v1::JobSpec& spec,
                                                BackendPart* failed) {
  *failed = BackendPart::kCommunicator;
#ifdef WEFT_WORKER_HAVE_CUDA
  WEFT_RETURN_IF_ERROR(
      engine::cuda::CudaStatus(cudaSetDevice(options.cuda_device), "cudaSetDevice"));
  comm::NcclOptions nccl_options;
  nccl_options.device = options.cuda_device;
  nccl_options.timeout_ms = options.collective_timeout_ms;
  auto connect = [&](const CommPart& part) {
    comm::NcclOptions part_options = nccl_options;
    part_options.store_prefix = part.prefix;
    return comm::CreateNcclCommunicator(store, part.rank, part.size, part_options);
  };
  // The engine needs the NCCL communicators' streams, so it gets the typed pointers.
  DeviceBackend backend;
  WEFT_ASSIGN_OR_RETURN(
      const EngineComms<comm::CudaCommunicator> comms,
      ConnectComms<comm::CudaCommunicator>("nccl", rank, groups, connect, &backend));
  *failed = BackendPart::kEngine;
  WEFT_ASSIGN_OR_RETURN(backend.engine,
                        zero::ZeroCudaEngine::Create(spec, comms.shards, comms.replica,
                                               options.ranks_on_host));
  return backend;
#else
  (void)options, (void)store, (void)rank, (void)groups, (void)spec;
  return absl::UnimplementedError("this weft-worker was built without CUDA");
#endif
}

}  // namespace

absl::StatusOr<DeviceBackend> CreateDeviceBackend(const DeviceOptions& options, Store* store,
                                                  int rank, const zero::ShardingGroups& groups,
                                                  const weft::v1::JobSpec& spec,
                                                  BackendPart* failed) {
  BackendPart ignored;
  if (failed == nullptr) failed = &ignored;
  if (options.cuda_device >= 0) {
    return CreateCudaBackend(options, store, rank, groups, spec, failed);
  }
  return CreateCpuBackend(options, store, rank, groups, spec, failed);
}

}  // namespace weft::worker
