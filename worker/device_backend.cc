#include "worker/device_backend.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/comm/hybrid_communicator.h"
#include "worker/comm/work.h"
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
    backend->shards = world.get();
    backend->comm = std::move(world);
    return comms;
  }
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<Comm> group, connect(GroupPart(base, groups, rank)));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<Comm> across, connect(ReplicaPart(base, groups, rank)));
  comms.shards = group.get();
  comms.replica = across.get();
  backend->shards = group.get();
  backend->replica = across.get();
  backend->comm = std::make_unique<comm::HybridCommunicator>(std::move(group), std::move(across));
  return comms;
}

// The all-reduce the AUTO scope times: large enough that bandwidth, not latency, decides.
constexpr size_t kProbeFloats = size_t{16} << 20;  // 64 MiB
constexpr int kProbeRuns = 3;

// Bus bandwidth (Gb/s) of an all-reduce of kProbeFloats over `replica`, on `buffer` (device
// memory for NCCL), after one untimed run; then the mean over `world`'s ranks, so that all
// decide alike.
absl::StatusOr<double> MeasureReplicaBusGbps(comm::Communicator& replica,
                                             comm::Communicator& world, float* buffer) {
  WEFT_RETURN_IF_ERROR(replica.AllReduce(buffer, kProbeFloats, comm::DataType::kFloat32)->Wait());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kProbeRuns; ++i) {
    WEFT_RETURN_IF_ERROR(
        replica.AllReduce(buffer, kProbeFloats, comm::DataType::kFloat32)->Wait());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      kProbeRuns;
  const double sent = static_cast<double>(comm::RingSentBytes(
      comm::OpKind::kAllReduce, kProbeFloats, sizeof(float), replica.world_size()));
  float gbps = static_cast<float>(sent * 8 / 1e9 / std::max(seconds, 1e-9));
  WEFT_RETURN_IF_ERROR(world.AllReduce(&gbps, 1, comm::DataType::kFloat32)->Wait());
  return static_cast<double>(gbps) / world.world_size();
}

// The spec the engine is built from: `spec`, or what `before_engine` settles with the
// measured bandwidth (`probe`: a kProbeFloats buffer the communicators reach).
template <typename Comm>
absl::StatusOr<weft::v1::JobSpec> SettleSpec(const weft::v1::JobSpec& spec,
                                             const BeforeEngine& before_engine,
                                             const EngineComms<Comm>& comms,
                                             comm::Communicator& world, float* probe) {
  if (!before_engine) return spec;
  double gbps = 0;
  if (comms.replica != nullptr) {
    WEFT_ASSIGN_OR_RETURN(gbps, MeasureReplicaBusGbps(*comms.replica, world, probe));
  }
  return before_engine(world, gbps);
}

absl::StatusOr<DeviceBackend> CreateCpuBackend(const DeviceOptions& options, Store* store,
                                               int rank, const zero::ShardingGroups& groups,
                                               const weft::v1::JobSpec& spec,
                                               BackendPart* failed,
                                               const BeforeEngine& before_engine) {
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
  std::vector<float> probe(before_engine && comms.replica != nullptr ? kProbeFloats : 0);
  WEFT_ASSIGN_OR_RETURN(
      const weft::v1::JobSpec settled,
      SettleSpec(spec, before_engine, comms, *backend.comm, probe.data()));
  probe = {};
  *failed = BackendPart::kEngine;
  WEFT_ASSIGN_OR_RETURN(backend.engine,
                        zero::ZeroCpuEngine::Create(settled, comms.shards, comms.replica,
                                              zero::ZeroCpuOptions{options.ranks_on_host}));
  return backend;
}

absl::StatusOr<DeviceBackend> CreateCudaBackend(const DeviceOptions& options, Store* store,
                                                int rank, const zero::ShardingGroups& groups,
                                                const weft::v1::JobSpec& spec,
                                                BackendPart* failed,
                                                const BeforeEngine& before_engine) {
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
  float* probe = nullptr;
  if (before_engine && comms.replica != nullptr) {
    WEFT_RETURN_IF_ERROR(engine::cuda::CudaStatus(
        cudaMalloc(reinterpret_cast<void**>(&probe), kProbeFloats * sizeof(float)),
        "cudaMalloc of the bandwidth probe"));
  }
  absl::StatusOr<weft::v1::JobSpec> settled =
      SettleSpec(spec, before_engine, comms, *backend.comm, probe);
  if (probe != nullptr) cudaFree(probe);
  WEFT_RETURN_IF_ERROR(settled.status());
  *failed = BackendPart::kEngine;
  WEFT_ASSIGN_OR_RETURN(backend.engine,
                        zero::ZeroCudaEngine::Create(*settled, comms.shards, comms.replica,
                                               options.ranks_on_host));
  return backend;
#else
  (void)options, (void)store, (void)rank, (void)groups, (void)spec, (void)before_engine;
  return absl::UnimplementedError("this weft-worker was built without CUDA");
#endif
}

}  // namespace

absl::StatusOr<DeviceBackend> CreateDeviceBackend(const DeviceOptions& options, Store* store,
                                                  int rank, const zero::ShardingGroups& groups,
                                                  const weft::v1::JobSpec& spec,
                                                  BackendPart* failed,
                                                  const BeforeEngine& before_engine) {
  BackendPart ignored;
  if (failed == nullptr) failed = &ignored;
  if (options.cuda_device >= 0) {
    return CreateCudaBackend(options, store, rank, groups, spec, failed, before_engine);
  }
  return CreateCpuBackend(options, store, rank, groups, spec, failed, before_engine);
}

absl::Status CheckShardedStateFits(const DeviceOptions& options, const weft::v1::JobSpec& spec,
                                   int group_size, int replicas) {
  if (options.cuda_device >= 0) {
#ifdef WEFT_WORKER_HAVE_CUDA
    WEFT_RETURN_IF_ERROR(
        engine::cuda::CudaStatus(cudaSetDevice(options.cuda_device), "cudaSetDevice"));
    return zero::ZeroCudaEngine::CheckFits(spec, group_size, replicas, options.ranks_on_host);
#else
    return absl::UnimplementedError("this weft-worker was built without CUDA");
#endif
  }
  return zero::ZeroCpuEngine::CheckFits(spec, group_size, replicas,
                                        zero::ZeroCpuOptions{options.ranks_on_host});
}

}  // namespace weft::worker
