#include "worker/device_backend.h"

#include <utility>

#include "common/status.h"
#include "worker/zero_cpu.h"
#ifdef WEFT_WORKER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/comm/nccl_communicator.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/zero_cuda.h"
#endif

namespace weft::worker {
namespace {

absl::StatusOr<DeviceBackend> CreateCpuBackend(const DeviceOptions& options, Store* store,
                                               int rank, int world,
                                               const weft::v1::JobSpec& spec,
                                               BackendPart* failed) {
  comm::GlooOptions gloo_options;
  gloo_options.hostname = options.data_address;
  gloo_options.timeout_ms = options.collective_timeout_ms;
  *failed = BackendPart::kCommunicator;
  DeviceBackend backend;
  WEFT_ASSIGN_OR_RETURN(backend.comm,
                        comm::CreateGlooCommunicator(store, rank, world, gloo_options));
  *failed = BackendPart::kEngine;
  WEFT_ASSIGN_OR_RETURN(backend.engine, ZeroCpuEngine::Create(spec, backend.comm.get()));
  return backend;
}

absl::StatusOr<DeviceBackend> CreateCudaBackend(const DeviceOptions& options, Store* store,
                                                int rank, int world,
                                                const weft::v1::JobSpec& spec,
                                                BackendPart* failed) {
  *failed = BackendPart::kCommunicator;
#ifdef WEFT_WORKER_HAVE_CUDA
  WEFT_RETURN_IF_ERROR(
      engine::cuda::CudaStatus(cudaSetDevice(options.cuda_device), "cudaSetDevice"));
  comm::NcclOptions nccl_options;
  nccl_options.device = options.cuda_device;
  nccl_options.timeout_ms = options.collective_timeout_ms;
  // The engine needs the NCCL communicator's stream, so it gets the typed pointer.
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<comm::CudaCommunicator> nccl,
                        comm::CreateNcclCommunicator(store, rank, world, nccl_options));
  comm::CudaCommunicator* typed = nccl.get();
  DeviceBackend backend;
  backend.comm = std::move(nccl);
  *failed = BackendPart::kEngine;
  WEFT_ASSIGN_OR_RETURN(backend.engine, ZeroCudaEngine::Create(spec, typed));
  return backend;
#else
  (void)options, (void)store, (void)rank, (void)world, (void)spec;
  return absl::UnimplementedError("this weft-worker was built without CUDA");
#endif
}

}  // namespace

absl::StatusOr<DeviceBackend> CreateDeviceBackend(const DeviceOptions& options, Store* store,
                                                  int rank, int world,
                                                  const weft::v1::JobSpec& spec,
                                                  BackendPart* failed) {
  BackendPart ignored;
  if (failed == nullptr) failed = &ignored;
  if (options.cuda_device >= 0) {
    return CreateCudaBackend(options, store, rank, world, spec, failed);
  }
  return CreateCpuBackend(options, store, rank, world, spec, failed);
}

}  // namespace weft::worker
