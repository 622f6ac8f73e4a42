// What LayerNorm (layernorm.cu) and RMSNorm (rmsnorm.cu) share: rows up to kOnePassNormMaxWidth
// wide go in one pass, forward and backward, and wider rows' backward takes the parameters'
// gradients as a column reduction over the rows.
//
// One pass, up to 8192 channels (GPT-2, GPT 6.7B, Llama-8B and Llama-70B widths): a row is
// spread over as many warps as it needs, 8 channels a thread held in registers, so the row is
// read once and its sums take an exchange through shared memory. The forwards are a block per
// row. The backward reads x, dy and dx once and writes dx once, 4 x (N, C) bf16, the least it
// can move; its blocks walk rows in lanes, the next row's x and dy loading while the block
// waits on the exchange, and each thread sums its channels' dweight (and dbias) over its lane's
// rows in registers. The lanes' partial rows are added in order afterwards
// (LaunchAddColumnSums). At 8192 x 4096 on an H100 the backward takes 0.112 ms a LayerNorm
// (2.4 TB/s of the least traffic) and 0.099 ms an RMSNorm, where the wide rows' two kernels
// (described next) moved 6 x (N, C) in 0.197 and 0.193 ms.
//
// A wider row would need more than a block's 1024 threads. There the forwards are a warp per
// row (the row read again from L1), and the backward a warp per row for dx (its two sums, then
// the row again, from L1 or L2) and a column reduction over the rows for the parameters'
// gradients. They hold nothing but registers, so any C that is a multiple of 8 goes.
#ifndef WEFT_WORKER_ENGINE_CUDA_NORM_CUH_
#define WEFT_WORKER_ENGINE_CUDA_NORM_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/launch.cuh"

namespace weft::engine::cuda::internal {

// Rows wider than one pass, phase 1 of the parameters' gradients, on the column slabs of
// bf16.cuh: block (tile, slab) sums over its slab's rows, for its 256 channels, dy * xhat into
// partials[slab, col] and, kWithBias, dy into partials[slab, C + col]. xhat = (x - mean) *
// rstd (LayerNorm; mean read only kWithBias) or x * rstd (RMSNorm). LaunchAddColumnSums
// finishes.
template <bool kWithBias>
__global__ void __launch_bounds__(kWarpSize* kColumnRowLanes)
    NormParamGradPartialKernel(float* __restrict__ partials,    // (slabs, C or 2C)
                               const bf16* __restrict__ dout,   // (N, C)
                               const bf16* __restrict__ inp,    // (N, C)
                               const float* __restrict__ mean,  // (N), kWithBias only
                               const float* __restrict__ rstd,  // (N)
                               int n, int c, int slab_rows) {
  constexpr int kSums = kWithBias ? 2 : 1;
  __shared__ float sums[kColumnRowLanes][kSums][kColumnTileChannels];
  const int col = (blockIdx.x * kWarpSize + threadIdx.x) * kVec;
  float dw[kVec] = {};
  float db[kVec] = {};
  if (col < c) {
    const int row_end = min(n, (static_cast<int>(blockIdx.y) + 1) * slab_rows);
    for (int row = blockIdx.y * slab_rows + threadIdx.y; row < row_end;
         row += kColumnRowLanes) {
      const int64_t at = static_cast<int64_t>(row) * c + col;
      float x[kVec];
      float dy[kVec];
      LoadVec(inp + at, x);
      LoadVec(dout + at, dy);
      const float m = kWithBias ? mean[row] : 0.0f;
      const float s = rstd[row];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        dw[k] += dy[k] * ((x[k] - m) * s);
        if constexpr (kWithBias) db[k] += dy[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    sums[threadIdx.y][0][threadIdx.x * kVec + k] = dw[k];
    if constexpr (kWithBias) sums[threadIdx.y][1][threadIdx.x * kVec + k] = db[k];
  }
  __syncthreads();
  // Each of the block's 256 threads finishes one channel of the tile: row lanes in order.
  const int tid = threadIdx.y * kWarpSize + threadIdx.x;
  const int out_col = blockIdx.x * kColumnTileChannels + tid;
  if (out_col >= c) return;
  float w = 0.0f;
  float b = 0.0f;
  for (int lane = 0; lane < kColumnRowLanes; ++lane) {
    w += sums[lane][0][tid];
    if constexpr (kWithBias) b += sums[lane][1][tid];
  }
  float* row_out = partials + static_cast<int64_t>(blockIdx.y) * kSums * c;
  row_out[out_col] = w;
  if constexpr (kWithBias) row_out[c + out_col] = b;
}

// Floats of scratch the parameters' gradients need at (n, c): a partial row of C (RMSNorm) or
// 2C (LayerNorm, with the bias) per slab.
inline size_t NormParamGradScratchFloats(int n, int c, bool with_bias) {
  if (n <= 0 || c <= 0) return 0;
  return static_cast<size_t>(ColumnSlabs(n, c)) * (with_bias ? 2 : 1) * c;
}

// dweight (and, with dbias, dbias) += the sums over the n rows, through `scratch`
// (NormParamGradScratchFloats), on `stream`. mean null for RMSNorm.
inline absl::Status LaunchNormParamGrad(float* dweight, float* dbias, const bf16* dout,
                                        const bf16* inp, const float* mean, const float* rstd,
                                        float* scratch, int n, int c, cudaStream_t stream) {
  const int slab_rows = ColumnSlabRows(n, c);
  const int slabs = ColumnSlabs(n, c);
  const dim3 grid((c + kColumnTileChannels - 1) / kColumnTileChannels, slabs);
  const dim3 block(kWarpSize, kColumnRowLanes);
  if (dbias != nullptr) {
    if (absl::Status s = Launch(NormParamGradPartialKernel<true>, grid, block, 0, stream,
                                scratch, dout, inp, mean, rstd, n, c, slab_rows);
        !s.ok()) {
      return s;
    }
    return LaunchAddColumnSums(dweight, dbias, c, scratch, slabs, 2 * c, stream);
  }
  if (absl::Status s = Launch(NormParamGradPartialKernel<false>, grid, block, 0, stream, scratch,
                              dout, inp, mean, rstd, n, c, slab_rows);
      !s.ok()) {
    return s;
  }
  return LaunchAddColumnSums(dweight, nullptr, c, scratch, slabs, c, stream);
}

// Widest row the one-pass kernels take: a row is at most one block of 1024 threads, 8 channels
// a thread.
inline constexpr int kOnePassNormMaxBlockThreads = 1024;
inline constexpr int kOnePassNormMaxWidth = kOnePassNormMaxBlockThreads * kVec;
// Threads a block of narrow rows aims at (several rows share it, a row lane each).
inline constexpr int kOnePassNormBlockThreads = 512;
// Blocks of the one-pass backward: 256 of up to 512 threads (one 4096-wide row, or several
// narrower ones), or 128 of one wider row (up to 8192 wide, 1024 threads), are one wave on an
// H100 or H200 (64 registers a thread, 1024 threads an SM, 132 SMs). A few more would be a
// second wave: 273 blocks of five 768-wide rows took 0.072 ms where 256 took 0.054.
inline constexpr int kOnePassNormBlocks = 256;

inline bool UsesOnePassNorm(int c) { return c <= kOnePassNormMaxWidth; }
inline int OnePassNormWarpsPerRow(int c) { return (c / kVec + kWarpSize - 1) / kWarpSize; }
// Threads that hold one row, 8 channels each, in whole warps.
inline int OnePassNormRowThreads(int c) { return OnePassNormWarpsPerRow(c) * kWarpSize; }
// Rows a block of the one-pass backward takes at a time: narrow rows share a block.
inline int OnePassNormLanesPerBlock(int c) {
  return std::max(1, kOnePassNormBlockThreads / OnePassNormRowThreads(c));
}
// Row lanes of the one-pass backward: lane l takes rows l, l + lanes, ..., with one partial
// row of the parameters' gradients each. A function of (N, C) alone, never of the device, so
// the order of the sums is reproducible.
inline int OnePassNormRowLanes(int n, int c) {
  const int blocks = OnePassNormRowThreads(c) > kOnePassNormBlockThreads ? kOnePassNormBlocks / 2
                                                                         : kOnePassNormBlocks;
  return std::min(n, blocks * OnePassNormLanesPerBlock(c));
}

// One row's inputs at one thread's 8 channels, still packed: loaded a round ahead, so their
// latency hides behind the current row's sums and barrier.
struct NormRowInputs {
  uint4 x = {};
  uint4 dy = {};
  float mean = 0.0f;
  float rstd = 0.0f;
};

// The one-pass backward, a block of lanes_per_block row lanes x `warps_per_row` warps:
//   dx += rstd * (g - mean(g) - xhat * mean(g * xhat))    (RMSNorm: no mean(g) term)
//   partials[lane, col] = sum over the lane's rows of dy * xhat, [lane, C + col] of dy
// g = dy * weight; xhat = (x - mean) * rstd (LayerNorm) or x * rstd (RMSNorm, mean unread).
template <bool kLayerNorm>
__global__ void __launch_bounds__(kOnePassNormMaxBlockThreads)
    NormBackwardOnePassKernel(bf16* __restrict__ dinp,          // (N, C) +=
                              float* __restrict__ partials,     // (lanes, C or 2C)
                              const bf16* __restrict__ dout,    // (N, C)
                              const bf16* __restrict__ inp,     // (N, C)
                              const bf16* __restrict__ weight,  // (C)
                              const float* __restrict__ mean,   // (N), kLayerNorm only
                              const float* __restrict__ rstd,   // (N)
                              int n, int c, int lanes, int warps_per_row) {
  constexpr int kSums = kLayerNorm ? 2 : 1;
  // A row's per-warp sums, two sets so one barrier a row suffices: row i's set is only
  // rewritten at row i + 2, after every thread has passed row i + 1's barrier.
  __shared__ float2 warp_sums[2][kOnePassNormMaxBlockThreads / kWarpSize];
  const int warp = threadIdx.x / kWarpSize;
  const int lane_in_block = warp / warps_per_row;
  const int first_warp = lane_in_block * warps_per_row;  // the row's first warp in the block
  const int col = ((warp - first_warp) * kWarpSize + threadIdx.x % kWarpSize) * kVec;
  const int lanes_per_block = blockDim.x / (warps_per_row * kWarpSize);
  const int row_lane = blockIdx.x * lanes_per_block + lane_in_block;
  const bool has_col = col < c && row_lane < lanes;
  const float inv_c = 1.0f / static_cast<float>(c);
  auto load = [&](int row, NormRowInputs& in) {
    if (!has_col || row >= n) return;
    const int64_t at = static_cast<int64_t>(row) * c + col;
    in.x = *reinterpret_cast<const uint4*>(inp + at);
    in.dy = *reinterpret_cast<const uint4*>(dout + at);
    if constexpr (kLayerNorm) in.mean = mean[row];
    in.rstd = rstd[row];
  };
  uint4 w_raw = {};
  if (has_col) w_raw = *reinterpret_cast<const uint4*>(weight + col);
  float dw[kVec] = {};
  float db[kVec] = {};
  NormRowInputs next;
  load(row_lane, next);
  // Every thread runs the same number of rounds: the barrier needs the whole block.
  const int rounds = (n + lanes - 1) / lanes;
  for (int round = 0; round < rounds; ++round) {
    const int row = row_lane + round * lanes;
    const bool live = has_col && row < n;
    const NormRowInputs in = next;
    load(row + lanes, next);
    // Unpacked twice, before and after the barrier: floats held across it would spill (1024
    // threads a block leave 64 registers a thread).
    float x[kVec];
    float dy[kVec];
    float w[kVec];
    float g_sum = 0.0f;
    float g_xhat_sum = 0.0f;
    if (live) {
      Unpack(in.x, x);
      Unpack(in.dy, dy);
      Unpack(w_raw, w);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float g = dy[k] * w[k];
        g_sum += g;
        g_xhat_sum += g * ((x[k] - in.mean) * in.rstd);
      }
    }
    g_sum = WarpSum(g_sum);
    g_xhat_sum = WarpSum(g_xhat_sum);
    float2* sums = warp_sums[round & 1];
    if (threadIdx.x % kWarpSize == 0) sums[warp] = make_float2(g_sum, g_xhat_sum);
    __syncthreads();
    if (!live) continue;
    g_sum = 0.0f;
    g_xhat_sum = 0.0f;
    for (int i = first_warp; i < first_warp + warps_per_row; ++i) {
      g_sum += sums[i].x;
      g_xhat_sum += sums[i].y;
    }
    const float g_mean = kLayerNorm ? g_sum * inv_c : 0.0f;
    const float g_xhat_mean = g_xhat_sum * inv_c;
    bf16* dx_at = dinp + static_cast<int64_t>(row) * c + col;
    float dx[kVec];
    LoadVec(dx_at, dx);
    Unpack(in.x, x);
    Unpack(in.dy, dy);
    Unpack(w_raw, w);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float xhat = (x[k] - in.mean) * in.rstd;
      dx[k] += (dy[k] * w[k] - g_mean - xhat * g_xhat_mean) * in.rstd;
      dw[k] += dy[k] * xhat;
      if constexpr (kLayerNorm) db[k] += dy[k];
    }
    StoreVec(dx_at, dx);
  }
  if (!has_col) return;
  float* out = partials + static_cast<int64_t>(row_lane) * kSums * c + col;
  StoreFloats(out, dw);
  if constexpr (kLayerNorm) StoreFloats(out + c, db);
}

// Floats of scratch a norm's backward needs at (n, c): a partial row of C (RMSNorm) or 2C
// (LayerNorm, with the bias) per row lane (one pass) or per slab of rows (wider rows).
inline size_t NormBackwardScratchFloats(int n, int c, bool with_bias) {
  if (!UsesOnePassNorm(c)) return NormParamGradScratchFloats(n, c, with_bias);
  if (n <= 0 || c <= 0) return 0;
  return static_cast<size_t>(OnePassNormRowLanes(n, c)) * (with_bias ? 2 : 1) * c;
}

// The one-pass backward (c <= kOnePassNormMaxWidth): dinp, dweight (and, LayerNorm, dbias) +=,
// through `scratch` (NormBackwardScratchFloats), on `stream`. mean null for RMSNorm.
template <bool kLayerNorm>
absl::Status LaunchNormBackwardOnePass(bf16* dinp, float* dweight, float* dbias,
                                       const bf16* dout, const bf16* inp, const bf16* weight,
                                       const float* mean, const float* rstd, float* scratch,
                                       int n, int c, cudaStream_t stream) {
  const int lanes = OnePassNormRowLanes(n, c);
  const int lanes_per_block = OnePassNormLanesPerBlock(c);
  const int blocks = (lanes + lanes_per_block - 1) / lanes_per_block;
  WEFT_BF16_RETURN_IF_ERROR(Launch(NormBackwardOnePassKernel<kLayerNorm>, blocks,
                                   lanes_per_block * OnePassNormRowThreads(c), 0, stream, dinp,
                                   scratch, dout, inp, weight, mean, rstd, n, c, lanes,
                                   OnePassNormWarpsPerRow(c)));
  return LaunchAddColumnSums(dweight, dbias, c, scratch, lanes, (kLayerNorm ? 2 : 1) * c,
                             stream);
}

}  // namespace weft::engine::cuda::internal

#endif  // WEFT_WORKER_ENGINE_CUDA_NORM_CUH_
