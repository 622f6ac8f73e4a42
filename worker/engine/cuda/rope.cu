// Rotary position embeddings (Llama), Hugging Face's rotate-half convention (llama_arch.h):
// within a head of size HS, element i < HS/2 and element i + HS/2 form a pair that turns by
// angle t * inv_freq[i] at position t:
//   forward   y_i = x_i cos - x_{i+HS/2} sin,   y_{i+HS/2} = x_{i+HS/2} cos + x_i sin
//   backward  the transpose, a turn by -angle: dx_i = dy_i cos + dy_{i+HS/2} sin, ...
// applied IN PLACE to the q and k heads of the qkv projection's output (flash attention then
// reads them there), v untouched. With `positions` (packed documents) row (b, t) turns by the
// angles of position positions[b, t] instead of t: each document starts again at 0.
//
// The angle tables are built once on the device from the host's inverse frequencies; the angle
// is the fp32 product t * inv_freq[i], as Hugging Face computes it, and cos / sin are fp32.
//
// In bf16: one thread per (row, head, 8-wide vector of the first half), so each thread loads
// the two 16-byte halves of its pairs and 8 cos and 8 sin values; fp32 math, rounded once.
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
using internal::StoreVec;

__global__ void RopeTablesKernel(float* __restrict__ cos_table,       // (maxT, half)
                                 float* __restrict__ sin_table,       // (maxT, half)
                                 const float* __restrict__ inv_freq,  // (half)
                                 int64_t n, int half) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float angle = static_cast<float>(i / half) * inv_freq[i % half];
    cos_table[i] = cosf(angle);
    sin_table[i] = sinf(angle);
  }
}

// kSign +1 turns by +angle (forward), -1 by -angle (backward).
template <int kSign>
__global__ void RopeKernel(bf16* __restrict__ qkv,                  // (B, T, (NH + 2 NKV) HS)
                           const int32_t* __restrict__ positions,  // (B, T) or nullptr
                           const float* __restrict__ cos_table,    // (maxT, HS/2)
                           const float* __restrict__ sin_table,    // (maxT, HS/2)
                           int64_t vecs, int t, int heads, int hs, int row_len) {
  const int half = hs / 2;
  const int head_vecs = half / kVec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int v = static_cast<int>(i % head_vecs) * kVec;
    const int64_t rest = i / head_vecs;
    const int head = static_cast<int>(rest % heads);  // q heads then k heads: contiguous
    const int64_t bt = rest / heads;
    const int pos = positions != nullptr ? positions[bt] : static_cast<int>(bt % t);
    bf16* lo = qkv + bt * row_len + static_cast<int64_t>(head) * hs + v;
    bf16* hi = lo + half;
    float x1[kVec], x2[kVec], c[kVec], s[kVec];
    LoadVec(lo, x1);
    LoadVec(hi, x2);
    LoadFloats(cos_table + static_cast<int64_t>(pos) * half + v, c);
    LoadFloats(sin_table + static_cast<int64_t>(pos) * half + v, s);
    float y1[kVec], y2[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float sn = kSign * s[k];
      y1[k] = x1[k] * c[k] - x2[k] * sn;
      y2[k] = x2[k] * c[k] + x1[k] * sn;
    }
    StoreVec(lo, y1);
    StoreVec(hi, y2);
  }
}

absl::Status CheckRopeShape(int b, int t, int nh, int nkv, int hs, const char* op) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(b, op, "b"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(t, op, "t"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(nh, op, "nh"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(nkv, op, "nkv"));
  if (hs <= 0 || hs % (2 * kVec) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": head size hs = ", hs, " must be a positive multiple of 16"));
  }
  return absl::OkStatus();
}

template <int kSign>
absl::Status LaunchRope(bf16* qkv, const int32_t* positions, const float* cos_table,
                        const float* sin_table, int b, int t, int nh, int nkv, int hs,
                        cudaStream_t stream, const char* op) {
  WEFT_BF16_RETURN_IF_ERROR(CheckRopeShape(b, t, nh, nkv, hs, op));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      op, {internal::Aligned16(qkv, "qkv"), internal::Aligned16(cos_table, "cos_table"),
           internal::Aligned16(sin_table, "sin_table")}));
  const int heads = nh + nkv;  // rotated: every q and k head
  const int row_len = (nh + 2 * nkv) * hs;
  const int64_t vecs = static_cast<int64_t>(b) * t * heads * (hs / 2 / kVec);
  return internal::Launch(RopeKernel<kSign>, internal::GridFor(vecs), internal::kBlockSize, 0,
                          stream, qkv, positions, cos_table, sin_table, vecs, t, heads, hs,
                          row_len);
}

}  // namespace

absl::Status RopeTables(float* cos_table, float* sin_table, const float* inv_freq, int max_t,
                        int half, cudaStream_t stream) {
  constexpr const char* kOp = "rope tables";
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(max_t, kOp, "max_t"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(half, kOp, "half"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::NotNull(cos_table, "cos_table"), internal::NotNull(sin_table, "sin_table"),
            internal::NotNull(inv_freq, "inv_freq")}));
  const int64_t n = static_cast<int64_t>(max_t) * half;
  return internal::Launch(RopeTablesKernel, internal::GridFor(n), internal::kBlockSize, 0, stream,
                          cos_table, sin_table, inv_freq, n, half);
}

absl::Status RopeForward(bf16* qkv, const int32_t* positions, const float* cos_table,
                         const float* sin_table, int b, int t, int nh, int nkv, int hs,
                         cudaStream_t stream) {
  return LaunchRope<1>(qkv, positions, cos_table, sin_table, b, t, nh, nkv, hs, stream, "rope");
}

absl::Status RopeBackward(bf16* dqkv, const int32_t* positions, const float* cos_table,
                          const float* sin_table, int b, int t, int nh, int nkv, int hs,
                          cudaStream_t stream) {
  return LaunchRope<-1>(dqkv, positions, cos_table, sin_table, b, t, nh, nkv, hs, stream,
                        "rope backward");
}

}  // namespace weft::engine::cuda
