// Classifier loss in bf16: softmax over the first V of Vp logits + cross-entropy, fused
// forward and backward, IN PLACE (the (N, Vp) logits are the largest activation; only their
// gradient is needed afterwards), as cpu/classifier.cc:
//   p = softmax(logits[:V]); losses[n] = -log p[target]
//   dlogits[n, j] = grad_scale * (p[j] - [j == target]) for j < V, 0 for the padding j >= V.
// A target < 0 (Hugging Face's ignore index, -100) is a row without a label: its loss is 0 and
// its whole dlogits row 0, so packed sequences can leave out the positions that cross into
// the next document.
//
// One block per row (Vp = 50304 at GPT-2 sizes, Vp % 8 == 0 for 16-byte vectors): pass 1
// takes an online max and sum of exp over the row, each thread over its vectors, combined
// through the warps' butterflies and then the warps in order (deterministic); pass 2 re-reads
// the row (100 KB, from L2) and writes the gradient. Padding columns are never read.
#include <cuda_runtime.h>

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

constexpr int kBlock = 512;
constexpr int kWarps = kBlock / kWarpSize;
constexpr int kBlockStride = kBlock * kVec;

__global__ void __launch_bounds__(kBlock)
    CrossEntropyKernel(bf16* __restrict__ logits,            // (N, Vp) in/out
                       float* __restrict__ losses,           // (N)
                       const int32_t* __restrict__ targets,  // (N)
                       int v, int vp, float grad_scale) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float row_lse;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  bf16* row = logits + static_cast<int64_t>(blockIdx.x) * vp;  // (Vp)
  const int target = targets[blockIdx.x];
  if (target < 0) {  // ignored (the whole block alike): no loss, a zero gradient row
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    const float zeros[kVec] = {};
    for (int j = threadIdx.x * kVec; j < vp; j += kBlockStride) StoreVec(row + j, zeros);
    return;
  }

  internal::MaxSum acc = {-INFINITY, 0.0f};
  for (int j = threadIdx.x * kVec; j < v; j += kBlockStride) {
    float x[kVec];
    LoadVec(row + j, x);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = j + k < v ? x[k] : -INFINITY;
    acc = internal::AddVec(acc, x);  // column j < V is real: at least one finite value
  }
  acc = internal::WarpMerge(acc);
  if (lane == 0) {
    warp_max[warp] = acc.m;
    warp_sum[warp] = acc.s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    internal::MaxSum total = {warp_max[0], warp_sum[0]};
    for (int w = 1; w < kWarps; ++w) total = internal::Merge(total, {warp_max[w], warp_sum[w]});
    const float lse = total.m + logf(total.s);
    row_lse = lse;
    // Read before the barrier below, i.e. before pass 2 overwrites the row.
    losses[blockIdx.x] = lse - __bfloat162float(row[target]);
  }
  __syncthreads();
  const float lse = row_lse;

  for (int j = threadIdx.x * kVec; j < vp; j += kBlockStride) {
    float g[kVec] = {};
    if (j < v) {
      LoadVec(row + j, g);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int col = j + k;
        const float p = col < v ? expf(g[k] - lse) : 0.0f;
        g[k] = col < v ? grad_scale * (p - (col == target ? 1.0f : 0.0f)) : 0.0f;
      }
    }
    StoreVec(row + j, g);
  }
}

}  // namespace

absl::Status CrossEntropyForwardBackward(bf16* logits, float* losses, const int32_t* targets,
                                         int n, int v, int vp, float grad_scale,
                                         cudaStream_t stream) {
  constexpr const char* kOp = "cross entropy";
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, kOp, "n"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(v, kOp, "v"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckMultipleOf8(vp, kOp, "vp"));
  if (v > vp) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": v = ", v, " exceeds the padded vocabulary vp = ", vp));
  }
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(logits, "logits"), internal::NotNull(losses, "losses"),
            internal::NotNull(targets, "targets")}));
  return internal::Launch(CrossEntropyKernel, n, kBlock, 0, stream, logits, losses, targets, v, vp,
                          grad_scale);
}

}  // namespace weft::engine::cuda
