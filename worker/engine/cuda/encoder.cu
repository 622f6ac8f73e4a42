// Encoder: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :] (GPT-2), and Llama's embedding,
// the same without wpe (EmbeddingForward / EmbeddingBackward).
//
// Contract (as cpu/encoder.cc): the backward ACCUMULATES (+=) into dwte and dwpe. Tokens must
// be in [0, Vp); the data layer validates them, and PlanEmbeddingGrad checks again.
//
// In bf16, each thread handles one 8-channel vector (C % 8 == 0, 16-byte aligned rows). dwpe
// is reduced over b in order. dwte follows the host-built EmbeddingGradPlan (ops.h): a thread
// per (segment, vector) sums its segment's rows in position order, onto the dwte row for a
// token of one segment or into a scratch slot otherwise; a second kernel adds each split
// token's slots onto its row in order. No atomics, so the sums (and training) repeat bit for
// bit; segments of at most 32 rows keep a frequent token (a byte-level space) from
// serialising on one thread.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"

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

// Plan layout (EmbeddingGradPlan::data): order[n], then per segment {begin, end, token, slot}
// (begin/end index order; slot -1: onto dwte directly), then per combine {token, first slot,
// slots}.
constexpr int kSegmentInts = 4;
constexpr int kCombineInts = 3;

// One thread per (segment, 8-channel vector).
__global__ void EmbeddingSegmentsKernel(float* __restrict__ dwte,           // (Vp, C) +=
                                        float* __restrict__ scratch,        // (slots, C)
                                        const bf16* __restrict__ dout,      // (B, T, C)
                                        const int32_t* __restrict__ plan, int n, int segments,
                                        int c) {
  const int vecs_per_row = c / kVec;
  const int32_t* order = plan;
  const int32_t* segment_table = plan + n;
  const int64_t work = static_cast<int64_t>(segments) * vecs_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < work;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t* seg = segment_table + (i / vecs_per_row) * kSegmentInts;
    const int ci = static_cast<int>(i % vecs_per_row) * kVec;
    const int slot = seg[3];
    float* dst = slot < 0 ? dwte + static_cast<int64_t>(seg[2]) * c + ci
                          : scratch + static_cast<int64_t>(slot) * c + ci;
    float acc[kVec];
    if (slot < 0) {
      LoadFloats(dst, acc);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = 0.0f;
    }
    for (int p = seg[0]; p < seg[1]; ++p) {
      float d[kVec];
      LoadVec(dout + static_cast<int64_t>(order[p]) * c + ci, d);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += d[k];
    }
    StoreFloats(dst, acc);
  }
}

// One thread per (split token, 8-channel vector): its slots, in order, onto its dwte row.
__global__ void EmbeddingCombineKernel(float* __restrict__ dwte,            // (Vp, C) +=
                                       const float* __restrict__ scratch,   // (slots, C)
                                       const int32_t* __restrict__ combines, int count, int c) {
  const int vecs_per_row = c / kVec;
  const int64_t work = static_cast<int64_t>(count) * vecs_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < work;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t* entry = combines + (i / vecs_per_row) * kCombineInts;
    const int ci = static_cast<int>(i % vecs_per_row) * kVec;
    float* dst = dwte + static_cast<int64_t>(entry[0]) * c + ci;
    float acc[kVec];
    LoadFloats(dst, acc);
    for (int s = entry[1]; s < entry[1] + entry[2]; ++s) {
      float part[kVec];
      LoadFloats(scratch + static_cast<int64_t>(s) * c + ci, part);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += part[k];
    }
    StoreFloats(dst, acc);
  }
}

absl::Status WteBackward(float* dwte, const bf16* dout, const EmbeddingGradPlan& plan,
                         const int32_t* plan_device, float* scratch, int n, int c,
                         cudaStream_t stream) {
  if (plan.n != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding backward: the plan is of ", plan.n, " positions, the batch has ", n));
  }
  if (plan.slots > 0 && scratch == nullptr) {
    return absl::InvalidArgumentError("embedding backward: scratch is null");
  }
  const int64_t segment_work = static_cast<int64_t>(plan.segments) * (c / kVec);
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(
      EmbeddingSegmentsKernel, internal::GridFor(segment_work), internal::kBlockSize, 0, stream,
      dwte, scratch, dout, plan_device, n, plan.segments, c));
  if (plan.combines == 0) return absl::OkStatus();
  const int64_t combine_work = static_cast<int64_t>(plan.combines) * (c / kVec);
  return internal::Launch(EmbeddingCombineKernel, internal::GridFor(combine_work),
                          internal::kBlockSize, 0, stream, dwte,
                          static_cast<const float*>(scratch),
                          plan_device + n + static_cast<int64_t>(plan.segments) * kSegmentInts,
                          plan.combines, c);
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

absl::StatusOr<EmbeddingGradPlan> PlanEmbeddingGrad(const int32_t* tokens, int n, int vp) {
  EmbeddingGradPlan plan;
  plan.n = n;
  // Counting sort by token (stable: positions stay in order within a token).
  std::vector<int32_t> start(static_cast<size_t>(vp) + 1, 0);
  for (int p = 0; p < n; ++p) {
    if (tokens[p] < 0 || tokens[p] >= vp) {
      return absl::InvalidArgumentError(absl::StrCat("embedding backward: token ", tokens[p],
                                                     " at position ", p, " is outside [0, ", vp,
                                                     ")"));
    }
    ++start[tokens[p] + 1];
  }
  for (int v = 0; v < vp; ++v) start[v + 1] += start[v];
  plan.data.resize(static_cast<size_t>(n));
  std::vector<int32_t> next(start.begin(), start.end() - 1);
  for (int p = 0; p < n; ++p) plan.data[next[tokens[p]]++] = p;
  std::vector<int32_t> combines;
  for (int v = 0; v < vp; ++v) {
    const int begin = start[v], end = start[v + 1];
    if (begin == end) continue;
    const bool split = end - begin > kEmbeddingSegment;
    if (split) combines.insert(combines.end(), {v, plan.slots, 0});
    for (int s = begin; s < end; s += kEmbeddingSegment) {
      plan.data.insert(plan.data.end(),
                       {s, std::min(end, s + kEmbeddingSegment), v, split ? plan.slots : -1});
      ++plan.segments;
      if (split) {
        ++plan.slots;
        ++combines.back();
      }
    }
  }
  plan.combines = static_cast<int>(combines.size() / kCombineInts);
  plan.data.insert(plan.data.end(), combines.begin(), combines.end());
  return plan;
}

size_t EmbeddingGradPlanMaxInts(int n) {
  // At most n segments (one a position) plus n / 32 from splitting, each of 4 ints; at most
  // n / 33 split tokens, each of 3.
  const size_t positions = static_cast<size_t>(std::max(n, 0));
  return positions + kSegmentInts * (positions + positions / kEmbeddingSegment + 1) +
         kCombineInts * (positions / (kEmbeddingSegment + 1) + 1);
}

size_t EmbeddingGradScratchFloats(int n, int c) {
  // A split token of L > 32 positions fills ceil(L / 32) <= 2L / 33 slots: 2n / 33 in all.
  return (2 * static_cast<size_t>(std::max(n, 0)) / (kEmbeddingSegment + 1) + 1) *
         static_cast<size_t>(c);
}

absl::Status EncoderBackward(float* dwte, float* dwpe, const bf16* dout,
                             const EmbeddingGradPlan& plan, const int32_t* plan_device,
                             float* scratch, int b, int t, int c, cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckBf16Shape(b, t, c));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "encoder", {internal::Aligned16(dwte, "dwte"), internal::Aligned16(dwpe, "dwpe"),
                  internal::Aligned16(dout, "dout"), internal::NotNull(plan_device, "plan")}));
  const int64_t tc_vecs = static_cast<int64_t>(t) * (c / kVec);
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(EncoderBackwardWpeKernel, internal::GridFor(tc_vecs),
                                             internal::kBlockSize, 0, stream, dwpe, dout, b, t, c));
  return WteBackward(dwte, dout, plan, plan_device, scratch, b * t, c, stream);
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

absl::Status EmbeddingBackward(float* dwte, const bf16* dout, const EmbeddingGradPlan& plan,
                               const int32_t* plan_device, float* scratch, int b, int t, int c,
                               cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckBf16Shape(b, t, c));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "embedding backward", {internal::Aligned16(dwte, "dwte"), internal::Aligned16(dout, "dout"),
                             internal::NotNull(plan_device, "plan")}));
  return WteBackward(dwte, dout, plan, plan_device, scratch, b * t, c, stream);
}

}  // namespace weft::engine::cuda
