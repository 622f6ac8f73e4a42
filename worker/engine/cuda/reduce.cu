#include "worker/engine/cuda/reduce.h"

#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"

namespace weft::engine::cuda {
namespace {

using internal::GridFor;
using internal::kBlockSize;

__global__ void AccumulateKernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] += src[i];
  }
}

// One block: each thread sums a strided subset, then a fixed-order tree over the block.
__global__ void SumKernel(float* out, const float* x, size_t n) {
  __shared__ float partial[kBlockSize];
  float sum = 0.0f;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out += partial[0];
}

}  // namespace

absl::Status AccumulateInto(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError("AccumulateInto: dst and src must not be null");
  }
  AccumulateKernel<<<GridFor(static_cast<int64_t>(n)), kBlockSize, 0, stream>>>(dst, src, n);
  return CudaStatus(cudaGetLastError(), "AccumulateKernel launch");
}

absl::Status SumInto(float* out, const float* x, size_t n, cudaStream_t stream) {
  if (out == nullptr || (x == nullptr && n > 0)) {
    return absl::InvalidArgumentError("SumInto: out and x must not be null");
  }
  SumKernel<<<1, kBlockSize, 0, stream>>>(out, x, n);
  return CudaStatus(cudaGetLastError(), "SumKernel launch");
}

}  // namespace weft::engine::cuda
