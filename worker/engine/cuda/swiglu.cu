// SwiGLU (Llama's MLP activation) on the fused gate_up projection's output, rows
// [gate (I) | up (I)]:
//   out = silu(gate) * up,  silu(g) = g * sigmoid(g)
//   dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  dup = dout * silu(g)
// The backward WRITES (=) the (N, 2I) gradient of gate_up, recomputing silu from gate; it may
// write it over gate_up itself.
//
// In bf16: memory-bound, one pass each way. A thread takes one 8-wide vector of a row's gate
// and the matching vector of its up (and of dout), fp32 math, rounded once on the store.
#include <cuda_runtime.h>

#include <cstdint>

#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using internal::kVec;
using internal::LoadVec;
using internal::StoreVec;

__device__ inline float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void SwiGluForwardKernel(bf16* __restrict__ out,            // (N, I)
                                    const bf16* __restrict__ gate_up,  // (N, 2I)
                                    int64_t vecs, int width) {         // vecs = N * I / 8
  const int row_vecs = width / kVec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs;
    const int col = static_cast<int>(i % row_vecs) * kVec;
    const bf16* gate = gate_up + row * 2 * width + col;
    float g[kVec], u[kVec];
    LoadVec(gate, g);
    LoadVec(gate + width, u);
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = g[k] * Sigmoid(g[k]) * u[k];
    StoreVec(out + i * kVec, g);
  }
}

// dgate_up may be gate_up: each thread reads its gate and up vectors before it writes their
// gradients there, and no other thread touches them (hence no __restrict__ on the pair).
__global__ void SwiGluBackwardKernel(bf16* dgate_up,                    // (N, 2I) =
                                     const bf16* __restrict__ dout,     // (N, I)
                                     const bf16* gate_up,               // (N, 2I)
                                     int64_t vecs, int width) {
  const int row_vecs = width / kVec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs;
    const int64_t offset = row * 2 * width + static_cast<int64_t>(i % row_vecs) * kVec;
    float g[kVec], u[kVec], d[kVec];
    LoadVec(gate_up + offset, g);
    LoadVec(gate_up + offset + width, u);
    LoadVec(dout + i * kVec, d);
    float dg[kVec], du[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float sig = Sigmoid(g[k]);
      du[k] = d[k] * g[k] * sig;
      dg[k] = d[k] * u[k] * sig * (1.0f + g[k] * (1.0f - sig));
    }
    StoreVec(dgate_up + offset, dg);
    StoreVec(dgate_up + offset + width, du);
  }
}

absl::Status CheckSwiGluShape(int n, int i, const char* op) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, op, "n"));
  return internal::CheckMultipleOf8(i, op, "i");
}

}  // namespace

absl::Status SwiGluForward(bf16* out, const bf16* gate_up, int n, int i, cudaStream_t stream) {
  constexpr const char* kOp = "swiglu";
  WEFT_BF16_RETURN_IF_ERROR(CheckSwiGluShape(n, i, kOp));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(out, "out"), internal::Aligned16(gate_up, "gate_up")}));
  const int64_t vecs = static_cast<int64_t>(n) * (i / kVec);
  return internal::Launch(SwiGluForwardKernel, internal::GridFor(vecs), internal::kBlockSize, 0,
                          stream, out, gate_up, vecs, i);
}

absl::Status SwiGluBackward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int n, int i,
                            cudaStream_t stream) {
  constexpr const char* kOp = "swiglu backward";
  WEFT_BF16_RETURN_IF_ERROR(CheckSwiGluShape(n, i, kOp));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(dgate_up, "dgate_up"), internal::Aligned16(dout, "dout"),
            internal::Aligned16(gate_up, "gate_up")}));
  const int64_t vecs = static_cast<int64_t>(n) * (i / kVec);
  return internal::Launch(SwiGluBackwardKernel, internal::GridFor(vecs), internal::kBlockSize, 0,
                          stream, dgate_up, dout, gate_up, vecs, i);
}

}  // namespace weft::engine::cuda
