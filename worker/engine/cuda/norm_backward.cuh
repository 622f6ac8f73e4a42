// What the backwards of LayerNorm (layernorm.cu) and RMSNorm (rmsnorm.cu) share: the weight
// gradient (and LayerNorm's bias gradient) as a column reduction over the rows.
//
// The backward of a norm is two kernels that hold nothing but registers, so both run at full
// occupancy: a warp per row for the input's gradient (the row's two sums need the whole row),
// and the column reduction below for the parameters' (which needs every row of a channel).
// Both read dout and the input; together they move 6 x (N, C) bf16 where one kernel that kept
// per-warp fp32 rows of accumulators in shared memory moved 4, but that one ran a handful of
// warps per SM, at a third of the bandwidth (953 GB/s for LayerNorm at 8192 x 4096 on an H100).
// It also capped C at what fit in shared memory; now any C that is a multiple of 8 goes.
#ifndef WEFT_WORKER_ENGINE_CUDA_NORM_BACKWARD_CUH_
#define WEFT_WORKER_ENGINE_CUDA_NORM_BACKWARD_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/launch.cuh"

namespace weft::engine::cuda::internal {

// Phase 1 of the parameters' gradients, on the column slabs of bf16.cuh: block (tile, slab)
// sums over its slab's rows, for its 256 channels, dy * xhat into partials[slab, col] and,
// kWithBias, dy into partials[slab, C + col]. xhat = (x - mean) * rstd (LayerNorm; mean
// read only kWithBias) or x * rstd (RMSNorm). LaunchAddColumnSums finishes.
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

}  // namespace weft::engine::cuda::internal

#endif  // WEFT_WORKER_ENGINE_CUDA_NORM_BACKWARD_CUH_
