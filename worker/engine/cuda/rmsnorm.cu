// RMSNorm over the last dimension (Llama): out = x * rstd * weight with
// rstd = 1 / sqrt(mean(x^2) + eps), Hugging Face's LlamaRMSNorm (statistics in fp32; the
// output is rounded to bf16 once, after the weight, where a bf16 transformers model rounds
// x * rstd before the weight too).
//
// Contract: the forward keeps rstd (N) for the backward; the backward ACCUMULATES (+=) into dinp
// (the residual stream's gradient) and dweight.
//
// Backward, with xhat = x * rstd and g = dy * weight:
//   dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum over rows of dy * xhat.
//
// In bf16: C % 8 == 0, rows read as 16-byte vectors, fp32 math, one warp per row (the sum of
// squares is a warp butterfly, then the row is read again from L1 for the output). dweight is
// reduced in two phases so it is bit-identical run to run: each backward block owns a fixed
// set of rows and keeps one fp32 accumulator row per warp in shared memory (a lane touches only
// its own channels), sums its warps in order into its row of `scratch`, and
// internal::LaunchAddColumnSums adds the blocks' rows in block order. The warps per block
// depend only on C (as many as fit the portable shared-memory budget, so C up to 24576), the
// block count on N and C.
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
using internal::LoadFloats;
using internal::LoadVec;
using internal::StoreFloats;
using internal::StoreVec;
using internal::WarpSum;

constexpr int kForwardWarps = internal::kBlockSize / kWarpSize;  // rows per forward block
// A lane's successive 8-channel vectors of a row are this many channels apart.
constexpr int kRowStep = kWarpSize * kVec;
// Backward: per warp a (C) fp32 dweight accumulator in shared memory.
constexpr int kBackwardFloatsPerChannel = 1;

__global__ void RmsNormForwardKernel(bf16* __restrict__ out,           // (N, C)
                                     float* __restrict__ rstd,         // (N)
                                     const bf16* __restrict__ inp,     // (N, C)
                                     const bf16* __restrict__ weight,  // (C)
                                     int n, int c, float eps) {
  const int row = blockIdx.x * kForwardWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= n) return;  // the whole warp leaves together
  const size_t base = static_cast<size_t>(row) * c;
  float squares = 0.0f;
  for (int j = lane * kVec; j < c; j += kRowStep) {
    float x[kVec];
    LoadVec(inp + base + j, x);
#pragma unroll
    for (int k = 0; k < kVec; ++k) squares += x[k] * x[k];
  }
  const float r = 1.0f / sqrtf(WarpSum(squares) / static_cast<float>(c) + eps);
  for (int j = lane * kVec; j < c; j += kRowStep) {
    float x[kVec];
    float w[kVec];
    LoadVec(inp + base + j, x);
    LoadVec(weight + j, w);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = x[k] * r * w[k];
    StoreVec(out + base + j, x);
  }
  if (lane == 0) rstd[row] = r;
}

// One 8-channel vector of a row's input, its output gradient and the weight, as floats.
struct RowVectors {
  float x[kVec];
  float dy[kVec];
  float w[kVec];
  __device__ void Load(const bf16* x_at, const bf16* dy_at, const bf16* w_at) {
    LoadVec(x_at, x);
    LoadVec(dy_at, dy);
    LoadVec(w_at, w);
  }
};

// Dynamic shared memory: (warps per block) * C floats (one dweight accumulator per warp).
__global__ void __launch_bounds__(internal::kMaxRowAccumulatorWarps * kWarpSize)
    RmsNormBackwardKernel(bf16* __restrict__ dinp,          // (N, C) +=
                          float* __restrict__ partials,     // (gridDim.x, C)
                          const bf16* __restrict__ dout,    // (N, C)
                          const bf16* __restrict__ inp,     // (N, C)
                          const bf16* __restrict__ weight,  // (C)
                          const float* __restrict__ rstd,   // (N)
                          int n, int c) {
  extern __shared__ float4 shared_vec[];
  const int warps = blockDim.x / kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  float* dw = reinterpret_cast<float*>(shared_vec) + static_cast<size_t>(warp) * c;  // (C)
  const float zero[kVec] = {};
  for (int j = lane * kVec; j < c; j += kRowStep) StoreFloats(dw + j, zero);
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int row = blockIdx.x * warps + warp; row < n; row += gridDim.x * warps) {
    const size_t base = static_cast<size_t>(row) * c;
    const float r = rstd[row];
    // Pass 1: the row's sum of g * xhat; pass 2 (from L1): dx and this warp's dweight.
    float dot = 0.0f;
    for (int j = lane * kVec; j < c; j += kRowStep) {
      RowVectors v;
      v.Load(inp + base + j, dout + base + j, weight + j);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += v.dy[k] * v.w[k] * (v.x[k] * r);
    }
    const float mean_dot = WarpSum(dot) * inv_c;
    for (int j = lane * kVec; j < c; j += kRowStep) {
      RowVectors v;
      v.Load(inp + base + j, dout + base + j, weight + j);
      float dx[kVec];
      float acc[kVec];
      LoadVec(dinp + base + j, dx);
      LoadFloats(dw + j, acc);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xhat = v.x[k] * r;
        dx[k] += r * (v.dy[k] * v.w[k] - xhat * mean_dot);
        acc[k] += v.dy[k] * xhat;
      }
      StoreVec(dinp + base + j, dx);
      StoreFloats(dw + j, acc);
    }
  }
  __syncthreads();
  const float* all = reinterpret_cast<const float*>(shared_vec);
  for (int col = threadIdx.x; col < c; col += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += all[static_cast<size_t>(w) * c + col];
    partials[static_cast<size_t>(blockIdx.x) * c + col] = total;
  }
}

absl::Status CheckRows(int n, int c, const char* op) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, op, "n"));
  return internal::CheckMultipleOf8(c, op, "c");
}

}  // namespace

absl::Status RmsNormForward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int n,
                            int c, float eps, cudaStream_t stream) {
  constexpr const char* kOp = "rmsnorm";
  WEFT_BF16_RETURN_IF_ERROR(CheckRows(n, c, kOp));
  if (!(eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": eps = ", eps, " must be positive"));
  }
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(out, "out"), internal::NotNull(rstd, "rstd"),
            internal::Aligned16(inp, "inp"), internal::Aligned16(weight, "weight")}));
  const int blocks = (n + kForwardWarps - 1) / kForwardWarps;
  return internal::Launch(RmsNormForwardKernel, blocks, internal::kBlockSize, 0, stream, out,
                          rstd, inp, weight, n, c, eps);
}

int RmsNormMaxChannels() {
  return internal::RowAccumulatorMaxChannels(kBackwardFloatsPerChannel);
}

size_t RmsNormBackwardScratchFloats(int n, int c) {
  if (n <= 0 || c <= 0) return 0;
  return static_cast<size_t>(
             internal::PlanRowAccumulators(n, c, kBackwardFloatsPerChannel).blocks) *
         c;
}

absl::Status RmsNormBackward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp,
                             const bf16* weight, const float* rstd, float* scratch, int n, int c,
                             cudaStream_t stream) {
  constexpr const char* kOp = "rmsnorm backward";
  WEFT_BF16_RETURN_IF_ERROR(CheckRows(n, c, kOp));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(dinp, "dinp"), internal::NotNull(dweight, "dweight"),
            internal::Aligned16(dout, "dout"), internal::Aligned16(inp, "inp"),
            internal::Aligned16(weight, "weight"), internal::NotNull(rstd, "rstd"),
            internal::NotNull(scratch, "scratch")}));
  WEFT_BF16_RETURN_IF_ERROR(
      internal::CheckRowAccumulatorWidth(kOp, c, kBackwardFloatsPerChannel));
  const internal::RowAccumulatorLaunch launch =
      internal::PlanRowAccumulators(n, c, kBackwardFloatsPerChannel);
  WEFT_BF16_RETURN_IF_ERROR(internal::AllowSharedBytes(RmsNormBackwardKernel, launch.shared_bytes));
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(
      RmsNormBackwardKernel, launch.blocks, launch.warps * kWarpSize, launch.shared_bytes, stream,
      dinp, scratch, dout, inp, weight, rstd, n, c));
  return internal::LaunchAddColumnSums(dweight, nullptr, c, scratch, launch.blocks, c, stream);
}

}  // namespace weft::engine::cuda
