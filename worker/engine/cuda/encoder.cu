// Encoder: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :] (GPT-2), and Llama's embedding,
// the same without wpe (EmbeddingForward / EmbeddingBackward).
//
// Contract (as cpu/encoder.cc): the backward ACCUMULATES (+=) into dwte and dwpe and reads
// only the tokens. Tokens must be in [0, V); the data layer validates them.
//
// In bf16, each thread handles one 8-channel vector (C % 8 == 0, 16-byte aligned rows). dwpe
// is reduced over b in order (deterministic); dwte uses one fp32 atomicAdd per element, since
// a serial walk over B * T would dominate the step at GPT-2 sizes: repeated tokens make its
// summation order, hence its last bits, vary run to run.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using internal::kVec;
using internal::LoadFloats;
using internal::LoadVec;
using internal::StoreFloats;
using internal::StoreVec;

// kPositions false: no wpe (null), the rows of wte alone.
template <bool kPositions>
__global__ void EncoderForwardKernel(bf16* __restrict__ out,              // (B, T, C)
                                     const int32_t* __restrict__ tokens,  // (B, T)
                                     const bf16* __restrict__ wte,        // (Vp, C)
                                     const bf16* __restrict__ wpe,        // (maxT, C)
                                     int64_t vecs, int t, int c) {
  const int vecs_per_row = c / kVec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / vecs_per_row;
    const int ci = static_cast<int>(i % vecs_per_row) * kVec;
    const int ti = static_cast<int>(bt % t);
    float e[kVec];
    LoadVec(wte + static_cast<int64_t>(tokens[bt]) * c + ci, e);
    if constexpr (kPositions) {
      float p[kVec];
      LoadVec(wpe + static_cast<int64_t>(ti) * c + ci, p);
#pragma unroll
      for (int k = 0; k < kVec; ++k) e[k] += p[k];
    }
    StoreVec(out + bt * c + ci, e);
  }
}

// One thread per (t, 8-channel vector): adds dout over b in order onto dwpe.
__global__ void EncoderBackwardWpeKernel(float* __restrict__ dwpe,       // (maxT, C) +=
                                         const bf16* __restrict__ dout,  // (B, T, C)
                                         int b, int t, int c) {
  const int64_t tc = static_cast<int64_t>(t) * c;
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kVec; i < tc;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * kVec) {
    float acc[kVec];
    LoadFloats(dwpe + i, acc);  // (t, c) and (b = 0, t, c) share the offset i
    for (int bi = 0; bi < b; ++bi) {
      float d[kVec];
      LoadVec(dout + bi * tc + i, d);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += d[k];
    }
    StoreFloats(dwpe + i, acc);
  }
}

__global__ void EncoderBackwardWteKernel(float* __restrict__ dwte,            // (Vp, C) +=
                                         const bf16* __restrict__ dout,       // (B, T, C)
                                         const int32_t* __restrict__ tokens,  // (B, T)
                                         int64_t vecs, int c) {
  const int vecs_per_row = c / kVec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / vecs_per_row;
    const int ci = static_cast<int>(i % vecs_per_row) * kVec;
    float d[kVec];
    LoadVec(dout + bt * c + ci, d);
    float* dst = dwte + static_cast<int64_t>(tokens[bt]) * c + ci;
#pragma unroll
    for (int k = 0; k < kVec; ++k) atomicAdd(dst + k, d[k]);
  }
}

absl::Status CheckBf16Shape(int b, int t, int c) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(b, "encoder", "b"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(t, "encoder", "t"));
  return internal::CheckMultipleOf8(c, "encoder", "c");
}

}  // namespace

absl::Status EncoderForward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe,
                            int b, int t, int c, cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckBf16Shape(b, t, c));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "encoder", {internal::Aligned16(out, "out"), internal::NotNull(tokens, "tokens"),
                  internal::Aligned16(wte, "wte"), internal::Aligned16(wpe, "wpe")}));
  const int64_t vecs = static_cast<int64_t>(b) * t * (c / kVec);
  return internal::Launch(EncoderForwardKernel<true>, internal::GridFor(vecs),
                          internal::kBlockSize, 0, stream, out, tokens, wte, wpe, vecs, t, c);
}

absl::Status EncoderBackward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens,
                             int b, int t, int c, cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckBf16Shape(b, t, c));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "encoder", {internal::NotNull(dwte, "dwte"), internal::Aligned16(dwpe, "dwpe"),
                  internal::Aligned16(dout, "dout"), internal::NotNull(tokens, "tokens")}));
  const int64_t tc_vecs = static_cast<int64_t>(t) * (c / kVec);
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(EncoderBackwardWpeKernel, internal::GridFor(tc_vecs),
                                             internal::kBlockSize, 0, stream, dwpe, dout, b, t, c));
  return EmbeddingBackward(dwte, dout, tokens, b, t, c, stream);
}

absl::Status EmbeddingForward(bf16* out, const int32_t* tokens, const bf16* wte, int b, int t,
                              int c, cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckBf16Shape(b, t, c));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "embedding", {internal::Aligned16(out, "out"), internal::NotNull(tokens, "tokens"),
                    internal::Aligned16(wte, "wte")}));
  const int64_t vecs = static_cast<int64_t>(b) * t * (c / kVec);
  return internal::Launch(EncoderForwardKernel<false>, internal::GridFor(vecs),
                          internal::kBlockSize, 0, stream, out, tokens, wte,
                          static_cast<const bf16*>(nullptr), vecs, t, c);
}

absl::Status EmbeddingBackward(float* dwte, const bf16* dout, const int32_t* tokens, int b, int t,
                               int c, cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckBf16Shape(b, t, c));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "embedding backward", {internal::NotNull(dwte, "dwte"), internal::Aligned16(dout, "dout"),
                             internal::NotNull(tokens, "tokens")}));
  const int64_t vecs = static_cast<int64_t>(b) * t * (c / kVec);
  return internal::Launch(EncoderBackwardWteKernel, internal::GridFor(vecs), internal::kBlockSize,
                          0, stream, dwte, dout, tokens, vecs, c);
}

}  // namespace weft::engine::cuda
