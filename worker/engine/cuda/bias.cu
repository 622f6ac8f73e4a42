// A Linear layer's bias gradient, dbias[o] += sum_n dout[n, o], and the second phase of the
// two-phase column reductions shared with LayerNorm (internal::LaunchAddColumnSums).
//
// Two phases, so the reduction over N (16K rows at GPT-2 124M sizes) is spread over the whole
// GPU yet summed in a fixed order (no atomics; bit-identical run to run):
//  1. A grid of (channel tiles) x (row slabs) blocks: each block sums its slab of rows for
//     256 channels (8 per thread, 16-byte loads; 8 row lanes per block, combined in order) and
//     writes one partial row into `scratch`.
//  2. LaunchAddColumnSums adds the slabs' partials in slab order onto dbias.
// The slab count depends only on (N, OC), never on the device, so results are reproducible.
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
using internal::kWarpSize;
using internal::LoadVec;

// Phase 1 (bf16.cuh's column slabs).
constexpr int kRowLanes = internal::kColumnRowLanes;
constexpr int kTileChannels = internal::kColumnTileChannels;

// Phase 2 block: 32 columns by kPartLanes lanes over the partial rows.
constexpr int kPartLanes = 8;

__global__ void __launch_bounds__(kWarpSize* kRowLanes)
    BiasBackwardPartialKernel(float* __restrict__ partials,    // (gridDim.y, OC)
                              const bf16* __restrict__ dout,   // (N, OC)
                              int n, int oc, int slab_rows) {
  __shared__ float sums[kRowLanes][kTileChannels];
  const int col = (blockIdx.x * kWarpSize + threadIdx.x) * kVec;
  float acc[kVec] = {};
  if (col < oc) {
    const int slab = blockIdx.y;
    const int row_end = min(n, (slab + 1) * slab_rows);
    for (int row = slab * slab_rows + threadIdx.y; row < row_end; row += kRowLanes) {
      float d[kVec];
      LoadVec(dout + static_cast<int64_t>(row) * oc + col, d);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += d[k];
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) sums[threadIdx.y][threadIdx.x * kVec + k] = acc[k];
  __syncthreads();
  // Each of the block's 256 threads finishes one channel of the tile: row lanes in order.
  const int tid = threadIdx.y * kWarpSize + threadIdx.x;
  const int out_col = blockIdx.x * kTileChannels + tid;
  if (out_col < oc) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += sums[lane][tid];
    partials[static_cast<int64_t>(blockIdx.y) * oc + out_col] = total;
  }
}

// out (columns [0, split) of out0, the rest of out1) += sum over the partial rows, in order.
__global__ void __launch_bounds__(kWarpSize* kPartLanes)
    AddColumnSumsKernel(float* __restrict__ out0,            // (split) +=
                        float* __restrict__ out1,            // (m - split) +=
                        int split,
                        const float* __restrict__ partials,  // (parts, m)
                        int parts, int m) {
  __shared__ float sums[kPartLanes][kWarpSize];
  const int col = blockIdx.x * kWarpSize + threadIdx.x;
  float acc = 0.0f;
  if (col < m) {
    for (int p = threadIdx.y; p < parts; p += kPartLanes) {
      acc += partials[static_cast<int64_t>(p) * m + col];
    }
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < m) {
    float total = 0.0f;
    for (int lane = 0; lane < kPartLanes; ++lane) total += sums[lane][threadIdx.x];
    if (col < split) {
      out0[col] += total;
    } else {
      out1[col - split] += total;
    }
  }
}

}  // namespace

namespace internal {

absl::Status LaunchAddColumnSums(float* out0, float* out1, int split, const float* partials,
                                 int parts, int m, cudaStream_t stream) {
  const dim3 block(kWarpSize, kPartLanes);
  const int blocks = (m + kWarpSize - 1) / kWarpSize;
  return Launch(AddColumnSumsKernel, blocks, block, 0, stream, out0, out1, split, partials, parts,
                m);
}

}  // namespace internal

size_t BiasBackwardScratchFloats(int n, int oc) {
  if (n <= 0 || oc <= 0) return 0;
  return static_cast<size_t>(internal::ColumnSlabs(n, oc)) * oc;
}

absl::Status BiasBackward(float* dbias, const bf16* dout, float* scratch, int n, int oc,
                          cudaStream_t stream) {
  constexpr const char* kOp = "bias backward";
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, kOp, "n"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckMultipleOf8(oc, kOp, "oc"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::NotNull(dbias, "dbias"), internal::Aligned16(dout, "dout"),
            internal::NotNull(scratch, "scratch")}));
  const int slab_rows = internal::ColumnSlabRows(n, oc);
  const int slabs = internal::ColumnSlabs(n, oc);
  const dim3 grid((oc + kTileChannels - 1) / kTileChannels, slabs);
  const dim3 block(kWarpSize, kRowLanes);
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(BiasBackwardPartialKernel, grid, block, 0, stream,
                                             scratch, dout, n, oc, slab_rows));
  return internal::LaunchAddColumnSums(dbias, nullptr, oc, scratch, slabs, oc, stream);
}

}  // namespace weft::engine::cuda
