// Residual: out = inp1 + inp2, the fp32 sum of the two bf16 inputs rounded once to bf16, on
// 16-byte vectors of 8 values (the n % 8 tail elementwise). There is no backward kernel: the
// gradient passes through unchanged (ops.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

// Not __restrict__: out may be either input, each element read before it is written.
__global__ void ResidualForwardKernel(bf16* out,         // (N)
                                      const bf16* inp1,  // (N)
                                      const bf16* inp2,  // (N)
                                      int64_t n) {
  using internal::kVec;
  const int64_t vecs = n / kVec;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t i = tid; i < vecs; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float a[kVec];
    float b[kVec];
    internal::LoadVec(inp1 + i * kVec, a);
    internal::LoadVec(inp2 + i * kVec, b);
#pragma unroll
    for (int k = 0; k < kVec; ++k) a[k] += b[k];
    internal::StoreVec(out + i * kVec, a);
  }
  const int64_t tail = vecs * kVec + tid;  // the last n % 8 elements, one per thread
  if (tail < n) {
    out[tail] = __float2bfloat16(__bfloat162float(inp1[tail]) + __bfloat162float(inp2[tail]));
  }
}

}  // namespace

absl::Status ResidualForward(bf16* out, const bf16* inp1, const bf16* inp2, int64_t n,
                             cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, "residual", "n"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "residual", {internal::Aligned16(out, "out"), internal::Aligned16(inp1, "inp1"),
                   internal::Aligned16(inp2, "inp2")}));
  const int64_t vecs = (n + internal::kVec - 1) / internal::kVec;
  return internal::Launch(ResidualForwardKernel, internal::GridFor(vecs), internal::kBlockSize, 0,
                          stream, out, inp1, inp2, n);
}

}  // namespace weft::engine::cuda
