// GELU, tanh approximation (GPT-2's), the CPU op's formula:
//   gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),
// with tanh(u) = 1 - 2 / (exp(2u) + 1), as cpu/gelu.cc computes it, so both backends round
// the same way up to expf's last-ulp differences (CUDA's expf is within 2 ulp).
//
// Contract: the backward recomputes from the input and ACCUMULATES (+=) into dinp.
#include <cuda_runtime.h>

#include <cstdint>

#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCubic = 0.044715f;
// The CPU op writes T(3 * kCubic) with the product taken in double, then rounded.
constexpr float kThreeCubic = static_cast<float>(3 * 0.044715);

__device__ inline float TanhViaExp(float u) { return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f); }

__global__ void GeluForwardKernel(float* __restrict__ out,        // (N)
                                  const float* __restrict__ inp,  // (N)
                                  int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + TanhViaExp(u));
  }
}

__global__ void GeluBackwardKernel(float* __restrict__ dinp,        // (N) +=
                                   const float* __restrict__ inp,   // (N)
                                   const float* __restrict__ dout,  // (N)
                                   int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float th = TanhViaExp(u);
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx
    const float du_dx = kSqrt2OverPi * (1.0f + kThreeCubic * x * x);
    const float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
    dinp[i] += local * dout[i];
  }
}

}  // namespace

absl::Status GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("gelu: negative n");
  if (n == 0) return absl::OkStatus();
  GeluForwardKernel<<<internal::GridFor(n), internal::kBlockSize, 0, stream>>>(out, inp, n);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                          cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("gelu: negative n");
  if (n == 0) return absl::OkStatus();
  GeluBackwardKernel<<<internal::GridFor(n), internal::kBlockSize, 0, stream>>>(dinp, inp, dout,
                                                                                n);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace weft::engine::cuda
