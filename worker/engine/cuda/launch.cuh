// Launch helpers shared by the CUDA layer files.
#ifndef WEFT_WORKER_ENGINE_CUDA_LAUNCH_CUH_
#define WEFT_WORKER_ENGINE_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/engine/cuda/cuda_check.h"

namespace weft::engine::cuda::internal {

inline constexpr int kBlockSize = 256;
inline constexpr int kWarpSize = 32;
// Elementwise kernels use grid-stride loops; this cap keeps the grid a few waves deep on an
// H100 (132 SMs) instead of one block per 256 elements for 100M-element shards.
inline constexpr int64_t kMaxGrid = 132 * 32;

inline int GridFor(int64_t n, int block = kBlockSize) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

// Beyond 48 KiB of dynamic shared memory a kernel must opt in, once per size it asks for.
template <typename... Params>
absl::Status AllowSharedBytes(void (*kernel)(Params...), size_t shared_bytes) {
  if (shared_bytes <= 48 * 1024) return absl::OkStatus();
  return CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(shared_bytes)),
                    "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), returning the launch's error
// (cudaGetLastError) as a Status; an error in the kernel's execution surfaces at the caller's
// next synchronization.
template <typename... Params, typename... Args>
absl::Status Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                    cudaStream_t stream, Args... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
  return CudaStatus(cudaGetLastError(), "cudaGetLastError()");
}

// Sum over a warp; every lane gets the total. The butterfly order is fixed, so it is
// deterministic.
__device__ inline float WarpSum(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

}  // namespace weft::engine::cuda::internal

#endif  // WEFT_WORKER_ENGINE_CUDA_LAUNCH_CUH_
