// The non-GEMM parts of causal multi-head attention in bf16 (the GEMMs are cuBLAS batched, in
// the model code): head split/merge permutations and the causal softmax forward, recompute and
// backward. Heads as cpu/attention.cc: qkv rows are [q | k | v], each C wide, head h owning
// channels [h * HS, (h + 1) * HS) of each.
//
// Permutations: one thread per 16-byte vector of 8 channels (HS % 8 == 0), exact copies.
//
// Softmax: one warp per row of T scores (T % 8 == 0, so each row starts 16-byte aligned),
// 8 scores per lane per step. Row r is position i = r % T of its sequence; only columns
// [0, i] are read (the masked upper part is never loaded, only zero-filled), which halves the
// traffic on average; with document masking (doc_starts) only [doc start, i], from the
// 8-aligned vector holding the doc start on. The forward takes an online max and sum (one
// pass), combines the lanes with a fixed butterfly (deterministic), and writes
// P = exp(scale * s - lse) in a second pass (the row is then in L1/L2). Keeping lse lets the
// backward recompute P instead of storing it.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using internal::kVec;
using internal::kWarpSize;
using internal::LoadVec;
using internal::MaxSum;
using internal::StoreVec;

constexpr int kRowsPerBlock = internal::kBlockSize / kWarpSize;
constexpr int kLaneStride = kWarpSize * kVec;

// Up to three head-layout tensors (q, k, v) of one permutation.
struct HeadTensors {
  bf16* ptr[3];
};

// Where the 8-channel vector i of rows (B, T, n_tensors * C) lives in the head layout: the
// tensor (*which: 0 = q, 1 = k, 2 = v) and the element offset in its (B, NH, T, HS).
__device__ inline int64_t HeadOffset(int64_t i, int row_vecs, int t, int c, int hs, int nh,
                                     int* which) {
  const int64_t bt = i / row_vecs;
  const int col = static_cast<int>(i % row_vecs) * kVec;
  *which = col / c;
  const int h = (col % c) / hs;
  const int d = col % hs;
  const int64_t bi = bt / t;
  const int ti = static_cast<int>(bt % t);
  return ((bi * nh + h) * t + ti) * hs + d;
}

// The rows (B, T, n_tensors * C) of a permutation: const when they are its source.
template <bool kToHeads>
using RowsPointer = std::conditional_t<kToHeads, const bf16*, bf16*>;

// Copies rows to heads[which] (B, NH, T, HS) when kToHeads, else the other way, one 8-channel
// vector per step. Iterating in the row layout keeps both sides coalesced: a head's HS
// channels are contiguous in both layouts.
template <bool kToHeads>
__global__ void PermuteHeadsKernel(
    RowsPointer<kToHeads> __restrict__ rows,  // (B, T, n_tensors * C)
    HeadTensors heads,                        // n_tensors x (B, NH, T, HS)
    int64_t vecs, int t, int c, int hs, int nh, int n_tensors) {
  const int row_vecs = n_tensors * c / kVec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int which;
    const int64_t offset = HeadOffset(i, row_vecs, t, c, hs, nh, &which);
    if constexpr (kToHeads) {
      *reinterpret_cast<uint4*>(heads.ptr[which] + offset) =
          *reinterpret_cast<const uint4*>(rows + i * kVec);
    } else {
      *reinterpret_cast<uint4*>(rows + i * kVec) =
          *reinterpret_cast<const uint4*>(heads.ptr[which] + offset);
    }
  }
}

// Where row r's keys start: its document's first position (doc_starts, (B, T)), or 0 without
// document masking, raised to its window's first key r % T - window + 1 with a window (> 0).
// Row r is position r % T of sequence r / (NH * T).
__device__ inline int RowStart(const int32_t* __restrict__ doc_starts, int window, int64_t r, int t,
                               int nh) {
  const int start =
      doc_starts == nullptr ? 0 : doc_starts[(r / (static_cast<int64_t>(nh) * t)) * t + r % t];
  return window > 0 ? max(start, static_cast<int>(r % t) - window + 1) : start;
}

// Whether column col is one of the row's keys [start, pos].
__device__ inline bool Visible(int col, int start, int pos) { return col <= pos && col >= start; }

// Writes P = exp(scale * s - lse) over columns [start, pos] of the row and 0 elsewhere: the
// second pass of the forward and the whole of the recompute. Visible columns are read, masked
// ones only written.
__device__ inline void WriteCausalProbs(bf16* row,  // (T) in: raw scores, out: P
                                        int start, int pos, int t, float scale, float lse,
                                        int lane) {
  for (int j = lane * kVec; j < t; j += kLaneStride) {
    float p[kVec] = {};
    if (j <= pos && j + kVec > start) {
      LoadVec(row + j, p);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        // An explicit FMA: left to the compiler, contraction could differ between the forward
        // and the recompute, and the recompute must reproduce the forward's P bit for bit.
        p[k] = Visible(j + k, start, pos) ? expf(__fmaf_rn(scale, p[k], -lse)) : 0.0f;
      }
    }
    StoreVec(row + j, p);
  }
}

__global__ void CausalSoftmaxForwardKernel(bf16* __restrict__ att,                  // (rows, T)
                                           float* __restrict__ lse,                 // (rows)
                                           const int32_t* __restrict__ doc_starts,  // (B, T)
                                           int window, int64_t rows, int t, int nh, float scale) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (r >= rows) return;  // whole warps exit together
  const int pos = static_cast<int>(r % t);
  const int start = RowStart(doc_starts, window, r, t, nh);
  bf16* row = att + r * t;  // (T)
  MaxSum acc = {-INFINITY, 0.0f};
  // From the 8-aligned vector holding `start` on: every vector read holds a visible column
  // (column j itself, or `start` in the first), as AddVec needs.
  for (int j = (start / kVec) * kVec + lane * kVec; j <= pos; j += kLaneStride) {
    float x[kVec];
    LoadVec(row + j, x);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = Visible(j + k, start, pos) ? scale * x[k] : -INFINITY;
    acc = internal::AddVec(acc, x);
  }
  acc = internal::WarpMerge(acc);
  // Lane 0's value for every lane: P must be computed from exactly the lse that is stored, so
  // the recompute reproduces it bit for bit.
  const float row_lse = __shfl_sync(0xffffffffu, acc.m + logf(acc.s), 0);
  if (lane == 0) lse[r] = row_lse;
  WriteCausalProbs(row, start, pos, t, scale, row_lse, lane);
}

__global__ void CausalSoftmaxRecomputeKernel(bf16* __restrict__ att,                  // (rows, T)
                                             const float* __restrict__ lse,           // (rows)
                                             const int32_t* __restrict__ doc_starts,  // (B, T)
                                             int window, int64_t rows, int t, int nh, float scale) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  if (r >= rows) return;
  WriteCausalProbs(att + r * t, RowStart(doc_starts, window, r, t, nh), static_cast<int>(r % t), t,
                   scale, lse[r], threadIdx.x % kWarpSize);
}

// datt = scale * P * (datt - sum_j P[j] datt[j]) over the visible columns, 0 elsewhere.
__global__ void CausalSoftmaxBackwardKernel(bf16* __restrict__ datt,                 // (rows, T)
                                            const bf16* __restrict__ att,            // (rows, T)
                                            const int32_t* __restrict__ doc_starts,  // (B, T)
                                            int window, int64_t rows, int t, int nh, float scale) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (r >= rows) return;
  const int pos = static_cast<int>(r % t);
  const int start = RowStart(doc_starts, window, r, t, nh);
  bf16* d_row = datt + r * t;       // (T)
  const bf16* p_row = att + r * t;  // (T)
  float dot = 0.0f;
  for (int j = (start / kVec) * kVec + lane * kVec; j <= pos; j += kLaneStride) {
    float p[kVec];
    float d[kVec];
    LoadVec(p_row + j, p);
    LoadVec(d_row + j, d);
    // Mask explicitly: dP outside the row's keys comes from a full GEMM and is not zero.
#pragma unroll
    for (int k = 0; k < kVec; ++k) dot += Visible(j + k, start, pos) ? p[k] * d[k] : 0.0f;
  }
  dot = internal::WarpSum(dot);
  for (int j = lane * kVec; j < t; j += kLaneStride) {
    float g[kVec] = {};
    if (j <= pos && j + kVec > start) {
      float p[kVec];
      LoadVec(p_row + j, p);
      LoadVec(d_row + j, g);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        g[k] = Visible(j + k, start, pos) ? scale * p[k] * (g[k] - dot) : 0.0f;
      }
    }
    StoreVec(d_row + j, g);
  }
}

absl::Status CheckHeads(int b, int t, int c, int nh, const char* op) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(b, op, "b"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(t, op, "t"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(c, op, "c"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(nh, op, "nh"));
  if (c % nh != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": c = ", c, " is not a multiple of nh = ", nh));
  }
  return internal::CheckMultipleOf8(c / nh, op, "head size c / nh");
}

// The softmax ops' checks: att (aligned), the shape, then the op's other pointer. With
// doc_starts the rows must be whole sequences of nh heads (they index doc_starts).
absl::Status CheckSoftmax(const char* op, const bf16* att, const int32_t* doc_starts, int window,
                          int64_t rows, int t, int nh, internal::PointerArg other) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckAligned16(att, op, "att"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(rows, op, "rows"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckMultipleOf8(t, op, "t"));
  if (window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": window = ", window, " is negative (0: no window)"));
  }
  if (doc_starts != nullptr) {
    WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(nh, op, "nh"));
    if (rows % (static_cast<int64_t>(nh) * t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": rows = ", rows, " is not a whole number of sequences of nh * t = ",
          static_cast<int64_t>(nh) * t, " rows (doc_starts is indexed by sequence)"));
    }
  }
  return internal::CheckPointers(op, {other});
}

// A softmax kernel over `rows` rows, one warp per row.
template <typename... Params, typename... Args>
absl::Status LaunchPerRow(void (*kernel)(Params...), int64_t rows, cudaStream_t stream,
                          Args... args) {
  const int blocks = static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  return internal::Launch(kernel, blocks, internal::kBlockSize, 0, stream, args...);
}

// The permutation between rows (B, T, n_tensors * C) and the heads, one thread per 8-channel
// vector. The heads are only read when they are the source (kToHeads false), so const tensors
// may be cast for the shared struct.
template <bool kToHeads>
absl::Status Permute(RowsPointer<kToHeads> rows, HeadTensors heads, int n_tensors, int b, int t,
                     int c, int nh, cudaStream_t stream) {
  const int64_t vecs = static_cast<int64_t>(b) * t * n_tensors * c / kVec;
  return internal::Launch(PermuteHeadsKernel<kToHeads>, internal::GridFor(vecs),
                          internal::kBlockSize, 0, stream, rows, heads, vecs, t, c, c / nh, nh,
                          n_tensors);
}

}  // namespace

absl::Status AttentionSplitHeads(bf16* q, bf16* k, bf16* v, const bf16* qkv, int b, int t,
                                 int c, int nh, cudaStream_t stream) {
  constexpr const char* kOp = "attention split heads";
  WEFT_BF16_RETURN_IF_ERROR(CheckHeads(b, t, c, nh, kOp));
  WEFT_BF16_RETURN_IF_ERROR(
      internal::CheckPointers(kOp, {internal::Aligned16(q, "q"), internal::Aligned16(k, "k"),
                                    internal::Aligned16(v, "v"), internal::Aligned16(qkv, "qkv")}));
  return Permute<true>(qkv, {{q, k, v}}, 3, b, t, c, nh, stream);
}

absl::Status AttentionMergeHeads(bf16* out, const bf16* y, int b, int t, int c, int nh,
                                 cudaStream_t stream) {
  constexpr const char* kOp = "attention merge heads";
  WEFT_BF16_RETURN_IF_ERROR(CheckHeads(b, t, c, nh, kOp));
  WEFT_BF16_RETURN_IF_ERROR(
      internal::CheckPointers(kOp, {internal::Aligned16(out, "out"), internal::Aligned16(y, "y")}));
  return Permute<false>(out, {{const_cast<bf16*>(y), nullptr, nullptr}}, 1, b, t, c, nh, stream);
}

absl::Status AttentionSplitGrad(bf16* dy, const bf16* dout, int b, int t, int c, int nh,
                                cudaStream_t stream) {
  constexpr const char* kOp = "attention split grad";
  WEFT_BF16_RETURN_IF_ERROR(CheckHeads(b, t, c, nh, kOp));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(dy, "dy"), internal::Aligned16(dout, "dout")}));
  return Permute<true>(dout, {{dy, nullptr, nullptr}}, 1, b, t, c, nh, stream);
}

absl::Status AttentionMergeGrads(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv,
                                 int b, int t, int c, int nh, cudaStream_t stream) {
  constexpr const char* kOp = "attention merge grads";
  WEFT_BF16_RETURN_IF_ERROR(CheckHeads(b, t, c, nh, kOp));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(dqkv, "dqkv"), internal::Aligned16(dq, "dq"),
            internal::Aligned16(dk, "dk"), internal::Aligned16(dv, "dv")}));
  return Permute<false>(dqkv,
                        {{const_cast<bf16*>(dq), const_cast<bf16*>(dk), const_cast<bf16*>(dv)}}, 3,
                        b, t, c, nh, stream);
}

absl::Status CausalSoftmaxForward(bf16* att, float* lse, const int32_t* doc_starts, int window,
                                  int64_t rows, int t, int nh, float scale, cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckSoftmax("causal softmax", att, doc_starts, window, rows, t, nh,
                                         internal::NotNull(lse, "lse")));
  return LaunchPerRow(CausalSoftmaxForwardKernel, rows, stream, att, lse, doc_starts, window, rows,
                      t, nh, scale);
}

absl::Status CausalSoftmaxRecompute(bf16* att, const float* lse, const int32_t* doc_starts,
                                    int window, int64_t rows, int t, int nh, float scale,
                                    cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckSoftmax("causal softmax recompute", att, doc_starts, window, rows,
                                         t, nh, internal::NotNull(lse, "lse")));
  return LaunchPerRow(CausalSoftmaxRecomputeKernel, rows, stream, att, lse, doc_starts, window,
                      rows, t, nh, scale);
}

absl::Status CausalSoftmaxBackward(bf16* datt, const bf16* att, const int32_t* doc_starts,
                                   int window, int64_t rows, int t, int nh, float scale,
                                   cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckSoftmax("causal softmax backward", att, doc_starts, window, rows,
                                         t, nh, internal::Aligned16(datt, "datt")));
  return LaunchPerRow(CausalSoftmaxBackwardKernel, rows, stream, datt, att, doc_starts, window,
                      rows, t, nh, scale);
}

}  // namespace weft::engine::cuda
