// Qwen3's per-head RMSNorm of q and k (cpu/qk_norm.cc's op in bf16): every q head and every k
// head of the qkv projection's output (B, T, W), W = (NH + 2 NKV) HS, rows [q | k | v], is
// normalized IN PLACE over its HS values, x <- x * rstd * weight, rstd = 1 / sqrt(mean(x^2) +
// eps), one weight (HS) for the q heads and one for the k heads; v untouched. It runs between
// the projection and rotary, which rotates the normalized heads in place.
//
// Backward, with xhat = x * rstd and g = dy * weight (rmsnorm.cu's):
//   dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum over heads of dy * xhat.
// dx overwrites dy in place (=); rstd is recomputed from the raw heads the forward kept (one
// sum of HS squares, cheaper than keeping and reading an fp32 per head).
//
// A head is at most 256 values, so a group of HS / 8 threads holds it, 8 values a thread from
// one 16-byte vector, and its sums are a butterfly over the group (a power of two of lanes
// inside one warp: HS 64 is 8 lanes, 128 is 16; lanes past HS / 8 hold zeros). Nothing goes
// through shared memory in the forward. The backward's weight gradients are summed in a fixed
// order: each group adds its heads in registers, a block's groups in order through shared
// memory into a partial row of 2 HS (q | k) per block in `scratch`, and LaunchAddColumnSums adds
// the blocks' rows in order: bit-identical run to run, the grid a function of the shape alone.
// Each pass moves 3 x the q | k bytes (forward: read, keep raw, write; backward: read raw and
// dy, write dx): at Qwen3-8B's heads (32 q, 8 k, HS 128) over 16384 rows on an H200, 0.125 ms
// forward (4.0 TB/s) and 0.144 ms backward (3.5 TB/s); HS 64, 0.065 and 0.078 ms.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using internal::kVec;
using internal::kWarpSize;
using internal::LoadVec;
using internal::StoreVec;
using internal::Unpack;

constexpr int kThreads = 256;
constexpr int kMaxHeadSize = kWarpSize * kVec;  // a warp holds a head
// Blocks of the backward: 4 an SM of an H100 or H200 (132 SMs) are one wave, and as many
// partial rows for the second phase. A constant, not the device's SM count, so the order of
// the weight gradient's sums is the same on every GPU.
constexpr int kBackwardBlocks = 4 * 132;

// Threads of a head's group: HS / 8 rounded up to a power of two, so the butterfly stays
// inside the group.
int GroupThreads(int hs) {
  int g = 1;
  while (g * kVec < hs) g *= 2;
  return g;
}

// Sum over a group of kGroup aligned lanes; every lane of the group gets the same bits (a + b
// and b + a round alike). Every lane of the warp must call it.
template <int kGroup>
__device__ inline float GroupSum(float x) {
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// A group of kGroup threads a head, kThreads / kGroup heads a block, one head each.
template <int kGroup>
__global__ void __launch_bounds__(kThreads)
    QkNormForwardKernel(bf16* __restrict__ qkv,             // (N, W) q, k in place
                        bf16* __restrict__ qk_raw,          // (N, (NH + NKV) HS) or nullptr
                        const bf16* __restrict__ q_weight,  // (HS)
                        const bf16* __restrict__ k_weight,  // (HS)
                        int64_t total_heads, int nh, int heads, int hs, int row_len, float eps) {
  const int64_t head = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup) +
                       threadIdx.x / kGroup;  // n * heads + h: q heads then k heads of a row
  const int col = (threadIdx.x % kGroup) * kVec;
  // No early return: the group's butterfly needs every lane of the warp.
  const bool live = head < total_heads && col < hs;
  const int64_t row = head / heads;
  const int h = static_cast<int>(head % heads);
  bf16* at = live ? qkv + row * row_len + static_cast<int64_t>(h) * hs + col : nullptr;
  uint4 raw = {};
  if (live) {
    raw = *reinterpret_cast<const uint4*>(at);
    if (qk_raw != nullptr) *reinterpret_cast<uint4*>(qk_raw + head * hs + col) = raw;
  }
  float x[kVec];
  Unpack(raw, x);
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) squares += x[k] * x[k];
  const float r = 1.0f / sqrtf(GroupSum<kGroup>(squares) / static_cast<float>(hs) + eps);
  if (!live) return;
  float w[kVec];
  LoadVec((h < nh ? q_weight : k_weight) + col, w);
#pragma unroll
  for (int k = 0; k < kVec; ++k) x[k] = x[k] * r * w[k];
  StoreVec(at, x);
}

// Groups as the forward's, each taking heads group, group + lanes, ... (lanes = the grid's
// groups), all groups the same number of rounds so the butterflies meet. Writes dx over dy and
// partials[block] = [sum of dy * xhat over the block's q heads | over its k heads].
template <int kGroup>
__global__ void __launch_bounds__(kThreads)
    QkNormBackwardKernel(bf16* __restrict__ dqkv,            // (N, W) dq, dk in place
                         float* __restrict__ partials,       // (blocks, 2 HS)
                         const bf16* __restrict__ qk_raw,    // (N, (NH + NKV) HS)
                         const bf16* __restrict__ q_weight,  // (HS)
                         const bf16* __restrict__ k_weight,  // (HS)
                         int64_t total_heads, int nh, int heads, int hs, int row_len, float eps) {
  constexpr int kGroups = kThreads / kGroup;
  // A block's groups' weight-gradient sums: kGroups x 2 HS <= kThreads * 2 kVec floats, as
  // HS <= 8 kGroup.
  __shared__ float sums[kThreads * 2 * kVec];
  const int group = threadIdx.x / kGroup;
  const int col = (threadIdx.x % kGroup) * kVec;
  const bool has_col = col < hs;
  const int64_t lanes = static_cast<int64_t>(gridDim.x) * kGroups;
  const int64_t rounds = (total_heads + lanes - 1) / lanes;
  uint4 wq_raw = {};
  uint4 wk_raw = {};
  if (has_col) {
    wq_raw = *reinterpret_cast<const uint4*>(q_weight + col);
    wk_raw = *reinterpret_cast<const uint4*>(k_weight + col);
  }
  float dwq[kVec] = {};
  float dwk[kVec] = {};
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t head = static_cast<int64_t>(blockIdx.x) * kGroups + group + round * lanes;
    const bool live = has_col && head < total_heads;
    const int64_t row = head / heads;
    const int h = static_cast<int>(head % heads);
    const bool is_q = h < nh;
    bf16* dx_at = live ? dqkv + row * row_len + static_cast<int64_t>(h) * hs + col : nullptr;
    uint4 x_raw = {};
    uint4 dy_raw = {};
    if (live) {
      x_raw = *reinterpret_cast<const uint4*>(qk_raw + head * hs + col);
      dy_raw = *reinterpret_cast<const uint4*>(dx_at);
    }
    float x[kVec];
    float dy[kVec];
    float w[kVec];
    Unpack(x_raw, x);
    Unpack(dy_raw, dy);
    Unpack(is_q ? wq_raw : wk_raw, w);
    // mean(g * xhat) = rstd * mean(g * x): both sums in one butterfly, before rstd is known.
    float squares = 0.0f;
    float gx = 0.0f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      squares += x[k] * x[k];
      gx += dy[k] * w[k] * x[k];
    }
    squares = GroupSum<kGroup>(squares);
    gx = GroupSum<kGroup>(gx);
    if (!live) continue;
    const float inv_hs = 1.0f / static_cast<float>(hs);
    const float r = 1.0f / sqrtf(squares * inv_hs + eps);
    const float g_xhat_mean = gx * r * inv_hs;
    float dx[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float xhat = x[k] * r;
      dx[k] = r * (dy[k] * w[k] - xhat * g_xhat_mean);
      if (is_q) {
        dwq[k] += dy[k] * xhat;
      } else {
        dwk[k] += dy[k] * xhat;
      }
    }
    StoreVec(dx_at, dx);
  }
  const int width = 2 * hs;
  if (has_col) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      sums[group * width + col + k] = dwq[k];
      sums[group * width + hs + col + k] = dwk[k];
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < width; c += kThreads) {
    float total = 0.0f;
    for (int g = 0; g < kGroups; ++g) total += sums[g * width + c];
    partials[static_cast<int64_t>(blockIdx.x) * width + c] = total;
  }
}

absl::Status CheckShape(int n, int nh, int nkv, int hs, float eps, const char* op) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, op, "n"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(nh, op, "nh"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(nkv, op, "nkv"));
  if (hs <= 0 || hs % kVec != 0 || hs > kMaxHeadSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": head size hs = ", hs, " must be a positive multiple of 8 up to ", kMaxHeadSize));
  }
  if (!(eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": eps = ", eps, " must be positive"));
  }
  return absl::OkStatus();
}

int64_t TotalHeads(int n, int nh, int nkv) { return static_cast<int64_t>(n) * (nh + nkv); }

int BackwardBlocks(int n, int nh, int nkv, int hs) {
  const int64_t groups = kThreads / GroupThreads(hs);
  return static_cast<int>(
      std::min<int64_t>(kBackwardBlocks, (TotalHeads(n, nh, nkv) + groups - 1) / groups));
}

// The instantiations for a group of `group` threads (GroupThreads: a power of two <= 32).
using KernelFn = void (*)(bf16*, bf16*, const bf16*, const bf16*, int64_t, int, int, int, int,
                          float);
using BackwardKernelFn = void (*)(bf16*, float*, const bf16*, const bf16*, const bf16*, int64_t,
                                  int, int, int, int, float);

KernelFn ForwardKernelFor(int group) {
  switch (group) {
    case 1:
      return QkNormForwardKernel<1>;
    case 2:
      return QkNormForwardKernel<2>;
    case 4:
      return QkNormForwardKernel<4>;
    case 8:
      return QkNormForwardKernel<8>;
    case 16:
      return QkNormForwardKernel<16>;
    default:
      return QkNormForwardKernel<32>;
  }
}

BackwardKernelFn BackwardKernelFor(int group) {
  switch (group) {
    case 1:
      return QkNormBackwardKernel<1>;
    case 2:
      return QkNormBackwardKernel<2>;
    case 4:
      return QkNormBackwardKernel<4>;
    case 8:
      return QkNormBackwardKernel<8>;
    case 16:
      return QkNormBackwardKernel<16>;
    default:
      return QkNormBackwardKernel<32>;
  }
}

}  // namespace

absl::Status QkNormForward(bf16* qkv, bf16* qk_raw, const bf16* q_weight, const bf16* k_weight,
                           int n, int nh, int nkv, int hs, float eps, cudaStream_t stream) {
  constexpr const char* kOp = "qk norm";
  WEFT_BF16_RETURN_IF_ERROR(CheckShape(n, nh, nkv, hs, eps, kOp));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(qkv, "qkv"), internal::Aligned16(q_weight, "q_weight"),
            internal::Aligned16(k_weight, "k_weight")}));
  if (qk_raw != nullptr) {
    WEFT_BF16_RETURN_IF_ERROR(internal::CheckAligned16(qk_raw, kOp, "qk_raw"));
  }
  const int group = GroupThreads(hs);
  const int64_t total = TotalHeads(n, nh, nkv);
  const int64_t groups = kThreads / group;
  const int64_t blocks = (total + groups - 1) / groups;
  return internal::Launch(ForwardKernelFor(group), dim3(static_cast<unsigned>(blocks)), kThreads, 0,
                          stream, qkv, qk_raw, q_weight, k_weight, total, nh, nh + nkv, hs,
                          (nh + 2 * nkv) * hs, eps);
}

size_t QkNormBackwardScratchFloats(int n, int nh, int nkv, int hs) {
  if (n <= 0 || nh <= 0 || nkv <= 0 || hs <= 0 || hs > kMaxHeadSize) return 0;
  return static_cast<size_t>(BackwardBlocks(n, nh, nkv, hs)) * 2 * hs;
}

absl::Status QkNormBackward(bf16* dqkv, float* dq_weight, float* dk_weight, const bf16* qk_raw,
                            const bf16* q_weight, const bf16* k_weight, float* scratch, int n,
                            int nh, int nkv, int hs, float eps, cudaStream_t stream) {
  constexpr const char* kOp = "qk norm backward";
  WEFT_BF16_RETURN_IF_ERROR(CheckShape(n, nh, nkv, hs, eps, kOp));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(dqkv, "dqkv"), internal::NotNull(dq_weight, "dq_weight"),
            internal::NotNull(dk_weight, "dk_weight"), internal::Aligned16(qk_raw, "qk_raw"),
            internal::Aligned16(q_weight, "q_weight"), internal::Aligned16(k_weight, "k_weight"),
            internal::NotNull(scratch, "scratch")}));
  const int blocks = BackwardBlocks(n, nh, nkv, hs);
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(
      BackwardKernelFor(GroupThreads(hs)), blocks, kThreads, 0, stream, dqkv, scratch, qk_raw,
      q_weight, k_weight, TotalHeads(n, nh, nkv), nh, nh + nkv, hs, (nh + 2 * nkv) * hs, eps));
  return internal::LaunchAddColumnSums(dq_weight, dk_weight, hs, scratch, blocks, 2 * hs, stream);
}

}  // namespace weft::engine::cuda
