// GELU, tanh approximation (GPT-2's), the CPU op's formula:
//   gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),
// with tanh(u) = 1 - 2 / (exp(2u) + 1), as cpu/gelu.cc computes it, so both backends round
// the same way up to expf's last-ulp differences (CUDA's expf is within 2 ulp).
//
// In bf16: fp32 math on 16-byte vectors of 8 values (the n % 8 tail elementwise), rounded to
// bf16 on the store. The backward recomputes from the input and WRITES dinp (=), unlike the
// CPU op's, which accumulates (hence its name, GeluBackwardOverwrite); it may run in place
// (dinp == dout), so those two pointers are not __restrict__.
//
// The model itself fuses GELU into the MLP GEMMs' epilogues (matmul.h); these kernels are the
// standalone form of the same formula.
#include <cuda_runtime.h>

#include <cstdint>

#include "worker/engine/cuda/bf16.cuh"
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

__device__ inline float Gelu(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5f * x * (1.0f + TanhViaExp(u));
}

// d gelu / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx
__device__ inline float GeluGrad(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const float th = TanhViaExp(u);
  const float du_dx = kSqrt2OverPi * (1.0f + kThreeCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

using internal::kVec;
using internal::LoadVec;
using internal::StoreVec;

__global__ void GeluForwardKernel(bf16* __restrict__ out,        // (N)
                                  const bf16* __restrict__ inp,  // (N)
                                  int64_t n) {
  const int64_t vecs = n / kVec;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t i = tid; i < vecs; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[kVec];
    LoadVec(inp + i * kVec, x);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = Gelu(x[k]);
    StoreVec(out + i * kVec, x);
  }
  const int64_t tail = vecs * kVec + tid;  // the last n % 8 elements, one per thread
  if (tail < n) out[tail] = __float2bfloat16(Gelu(__bfloat162float(inp[tail])));
}

__global__ void GeluBackwardOverwriteKernel(bf16* dinp,                    // (N) =
                                            const bf16* __restrict__ inp,  // (N)
                                            const bf16* dout,              // (N), may be dinp
                                            int64_t n) {
  const int64_t vecs = n / kVec;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t i = tid; i < vecs; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[kVec];
    float d[kVec];
    LoadVec(inp + i * kVec, x);
    LoadVec(dout + i * kVec, d);
#pragma unroll
    for (int k = 0; k < kVec; ++k) d[k] *= GeluGrad(x[k]);
    StoreVec(dinp + i * kVec, d);
  }
  const int64_t tail = vecs * kVec + tid;
  if (tail < n) {
    dinp[tail] =
        __float2bfloat16(GeluGrad(__bfloat162float(inp[tail])) * __bfloat162float(dout[tail]));
  }
}

}  // namespace

absl::Status GeluForward(bf16* out, const bf16* inp, int64_t n, cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, "gelu", "n"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "gelu", {internal::Aligned16(out, "out"), internal::Aligned16(inp, "inp")}));
  return internal::Launch(GeluForwardKernel, internal::GridFor((n + kVec - 1) / kVec),
                          internal::kBlockSize, 0, stream, out, inp, n);
}

absl::Status GeluBackwardOverwrite(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n,
                                   cudaStream_t stream) {
  constexpr const char* kOp = "gelu backward";
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, kOp, "n"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(dinp, "dinp"), internal::Aligned16(inp, "inp"),
            internal::Aligned16(dout, "dout")}));
  return internal::Launch(GeluBackwardOverwriteKernel, internal::GridFor((n + kVec - 1) / kVec),
                          internal::kBlockSize, 0, stream, dinp, inp, dout, n);
}

}  // namespace weft::engine::cuda
