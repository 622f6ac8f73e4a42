// Encoder: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
//
// Contract (as cpu/encoder.cc): the backward ACCUMULATES (+=) into dwte and dwpe and reads
// only the tokens. Tokens must be in [0, V); the data layer validates them.
//
// Determinism: the backward uses no atomics. dwpe: one thread per (t, c) adds over b in order.
// dwte: one thread per channel walks every position in (b, t) order, so a token repeated in
// the batch adds into its row in the CPU op's order; the result is bit-identical to the CPU
// op. That walk is serial in B * T (a few ms at GPT-2 124M sizes); a sort-by-token reduction
// is the follow-up.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

__global__ void EncoderForwardKernel(float* __restrict__ out,             // (B, T, C)
                                     const int32_t* __restrict__ tokens,  // (B, T)
                                     const float* __restrict__ wte,       // (Vp, C)
                                     const float* __restrict__ wpe,       // (maxT, C)
                                     int64_t total, int t, int c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / c;
    const int ci = static_cast<int>(i % c);
    const int ti = static_cast<int>(bt % t);
    out[i] = wte[static_cast<int64_t>(tokens[bt]) * c + ci] + wpe[static_cast<int64_t>(ti) * c + ci];
  }
}

__global__ void EncoderBackwardWpeKernel(float* __restrict__ dwpe,        // (maxT, C) +=
                                         const float* __restrict__ dout,  // (B, T, C)
                                         int b, int t, int c) {
  const int64_t tc = static_cast<int64_t>(t) * c;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tc;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = dwpe[i];  // (t, c) and (b = 0, t, c) share the offset i
    for (int bi = 0; bi < b; ++bi) acc += dout[bi * tc + i];
    dwpe[i] = acc;
  }
}

__global__ void EncoderBackwardWteKernel(float* __restrict__ dwte,            // (Vp, C) +=
                                         const float* __restrict__ dout,      // (B, T, C)
                                         const int32_t* __restrict__ tokens,  // (B, T)
                                         int64_t bt_total, int c) {
  const int ci = blockIdx.x * blockDim.x + threadIdx.x;
  if (ci >= c) return;
  // Read-modify-write straight to memory each step: the same row may come back at any
  // position, and threads of other channels never touch this channel's column.
  for (int64_t bt = 0; bt < bt_total; ++bt) {
    dwte[static_cast<int64_t>(tokens[bt]) * c + ci] += dout[bt * c + ci];
  }
}

absl::Status CheckShape(int b, int t, int c) {
  if (b < 0 || t < 0 || c < 0) return absl::InvalidArgumentError("encoder: negative shape");
  return absl::OkStatus();
}

}  // namespace

absl::Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                            int b, int t, int c, cudaStream_t stream) {
  if (absl::Status s = CheckShape(b, t, c); !s.ok()) return s;
  const int64_t total = static_cast<int64_t>(b) * t * c;
  if (total == 0) return absl::OkStatus();
  EncoderForwardKernel<<<internal::GridFor(total), internal::kBlockSize, 0, stream>>>(
      out, tokens, wte, wpe, total, t, c);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                             int b, int t, int c, cudaStream_t stream) {
  if (absl::Status s = CheckShape(b, t, c); !s.ok()) return s;
  if (static_cast<int64_t>(b) * t * c == 0) return absl::OkStatus();
  const int64_t tc = static_cast<int64_t>(t) * c;
  EncoderBackwardWpeKernel<<<internal::GridFor(tc), internal::kBlockSize, 0, stream>>>(
      dwpe, dout, b, t, c);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const int wte_blocks = (c + internal::kBlockSize - 1) / internal::kBlockSize;
  EncoderBackwardWteKernel<<<wte_blocks, internal::kBlockSize, 0, stream>>>(
      dwte, dout, tokens, static_cast<int64_t>(b) * t, c);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace weft::engine::cuda
