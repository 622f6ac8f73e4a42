// Residual: out = inp1 + inp2.
//
// Contract (as cpu/residual.cc): the backward ACCUMULATES (+=) dout into dinp1 and dinp2.
// Both directions are one IEEE add per element, so they match the CPU op bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

__global__ void ResidualForwardKernel(float* __restrict__ out,         // (N)
                                      const float* __restrict__ inp1,  // (N)
                                      const float* __restrict__ inp2,  // (N)
                                      int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = inp1[i] + inp2[i];
  }
}

__global__ void ResidualBackwardKernel(float* __restrict__ dinp1,       // (N) +=
                                       float* __restrict__ dinp2,       // (N) +=
                                       const float* __restrict__ dout,  // (N)
                                       int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float d = dout[i];
    dinp1[i] += d;
    dinp2[i] += d;
  }
}

}  // namespace

absl::Status ResidualForward(float* out, const float* inp1, const float* inp2, int64_t n,
                             cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("residual: negative n");
  if (n == 0) return absl::OkStatus();
  ResidualForwardKernel<<<internal::GridFor(n), internal::kBlockSize, 0, stream>>>(out, inp1,
                                                                                   inp2, n);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status ResidualBackward(float* dinp1, float* dinp2, const float* dout, int64_t n,
                              cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("residual: negative n");
  if (n == 0) return absl::OkStatus();
  ResidualBackwardKernel<<<internal::GridFor(n), internal::kBlockSize, 0, stream>>>(
      dinp1, dinp2, dout, n);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace weft::engine::cuda
