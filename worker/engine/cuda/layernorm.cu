// LayerNorm over the last dimension: out = (x - mean) * rstd * weight + bias, with
// rstd = 1 / sqrt(var + 1e-5) and the biased variance, as cpu/layernorm.cc.
//
// Contract: the forward keeps mean and rstd (N) for the backward; the backward ACCUMULATES
// (+=) into dinp (the residual stream's gradient), dweight and dbias.
//
// In bf16: C % 8 == 0, rows read as 16-byte vectors, fp32 math. Forward: the mean, then the
// squared deviations as the CPU op (which stays accurate when |mean| >> std), then the output;
// up to 8192 wide a block per row holds the row in registers, wider rows take a warp each and
// read the row three times (the second and third from L1). The sums are taken in warp and
// block order instead of the CPU's serial loop, hence ~1e-6 relative differences. Backward
// (norm.cuh): up to 8192 wide one pass, a row over one block's warps; wider, a warp per
// row for dinp and a column reduction for dweight/dbias. Either way the parameters' sums run
// in a fixed order, so the result is bit-identical run to run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/engine/cpu/ops.h"
#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/norm.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using internal::kWarpSize;
using internal::WarpSum;

constexpr int kRowsPerBlock = internal::kBlockSize / kWarpSize;
constexpr float kEps = static_cast<float>(cpu::kLayerNormEps);

using internal::kVec;
using internal::LoadVec;
using internal::StoreVec;

// Row stride of one lane's 8-channel vectors within a row.
constexpr int kLaneStride = kWarpSize * kVec;

// The forward of rows wider than the one-pass kernel below takes: a warp per row.
__global__ void LayerNormForwardKernel(bf16* __restrict__ out,           // (N, C)
                                       float* __restrict__ mean,         // (N)
                                       float* __restrict__ rstd,         // (N)
                                       const bf16* __restrict__ inp,     // (N, C)
                                       const bf16* __restrict__ weight,  // (C)
                                       const bf16* __restrict__ bias,    // (C)
                                       int n, int c) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= n) return;  // whole warps exit together
  const bf16* x = inp + static_cast<int64_t>(row) * c;  // (C)
  bf16* y = out + static_cast<int64_t>(row) * c;        // (C)
  float sum = 0.0f;
  for (int j = lane * kVec; j < c; j += kLaneStride) {
    float v[kVec];
    LoadVec(x + j, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum += v[k];
  }
  const float m = WarpSum(sum) / c;
  // Two passes (mean, then squared deviations) as the CPU op: stays accurate when
  // |mean| >> std, as on the residual stream.
  float var_sum = 0.0f;
  for (int j = lane * kVec; j < c; j += kLaneStride) {
    float v[kVec];
    LoadVec(x + j, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float d = v[k] - m;
      var_sum += d * d;
    }
  }
  const float s = 1.0f / sqrtf(WarpSum(var_sum) / c + kEps);
  for (int j = lane * kVec; j < c; j += kLaneStride) {
    float v[kVec];
    float w[kVec];
    float b[kVec];
    LoadVec(x + j, v);
    LoadVec(weight + j, w);
    LoadVec(bias + j, b);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = (v[k] - m) * s * w[k] + b[k];
    StoreVec(y + j, v);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// The forward for rows up to internal::kOnePassNormMaxWidth wide: a block per row, 8 channels
// a thread, the row read once and kept in registers for the mean, the squared deviations and
// the output (the warp-per-row kernel above reads it three times, twice from L1: 1.4 TB/s at
// 8192 x 4096 on an H100).
__global__ void __launch_bounds__(internal::kOnePassNormMaxBlockThreads)
    LayerNormForwardRowKernel(bf16* __restrict__ out,           // (N, C)
                              float* __restrict__ mean,         // (N)
                              float* __restrict__ rstd,         // (N)
                              const bf16* __restrict__ inp,     // (N, C)
                              const bf16* __restrict__ weight,  // (C)
                              const bf16* __restrict__ bias,    // (C)
                              int c) {
  __shared__ float partial[internal::kOnePassNormMaxBlockThreads / kWarpSize];
  const int64_t at = static_cast<int64_t>(blockIdx.x) * c + threadIdx.x * kVec;
  const bool has_col = static_cast<int>(threadIdx.x) * kVec < c;
  float v[kVec] = {};
  if (has_col) LoadVec(inp + at, v);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) sum += v[k];
  const float m = internal::BlockSum(sum, partial) / c;
  float var_sum = 0.0f;
  if (has_col) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) var_sum += (v[k] - m) * (v[k] - m);
  }
  const float s = 1.0f / sqrtf(internal::BlockSum(var_sum, partial) / c + kEps);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
  if (!has_col) return;
  float w[kVec];
  float b[kVec];
  LoadVec(weight + threadIdx.x * kVec, w);
  LoadVec(bias + threadIdx.x * kVec, b);
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = (v[k] - m) * s * w[k] + b[k];
  StoreVec(out + at, v);
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight, xhat = (x - mean) * rstd;
// a warp per row: the row's two sums, then (the row again, from L1 or L2) dx. Rows wider than
// the one-pass backward takes.
__global__ void LayerNormBackwardInputKernel(bf16* __restrict__ dinp,          // (N, C) +=
                                             const bf16* __restrict__ dout,    // (N, C)
                                             const bf16* __restrict__ inp,     // (N, C)
                                             const bf16* __restrict__ weight,  // (C)
                                             const float* __restrict__ mean,   // (N)
                                             const float* __restrict__ rstd,   // (N)
                                             int n, int c) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= n) return;  // whole warps exit together
  const int64_t offset = static_cast<int64_t>(row) * c;
  const bf16* x = inp + offset;    // (C)
  const bf16* dy = dout + offset;  // (C)
  bf16* dx = dinp + offset;        // (C)
  const float m = mean[row];
  const float s = rstd[row];
  float g_sum = 0.0f;
  float g_xhat_sum = 0.0f;
  for (int j = lane * kVec; j < c; j += kLaneStride) {
    float xv[kVec];
    float dyv[kVec];
    float wv[kVec];
    LoadVec(x + j, xv);
    LoadVec(dy + j, dyv);
    LoadVec(weight + j, wv);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float g = dyv[k] * wv[k];
      g_sum += g;
      g_xhat_sum += g * ((xv[k] - m) * s);
    }
  }
  const float g_mean = WarpSum(g_sum) / c;
  const float g_xhat_mean = WarpSum(g_xhat_sum) / c;
  for (int j = lane * kVec; j < c; j += kLaneStride) {
    float xv[kVec];
    float dyv[kVec];
    float wv[kVec];
    float dxv[kVec];
    LoadVec(x + j, xv);
    LoadVec(dy + j, dyv);
    LoadVec(weight + j, wv);
    LoadVec(dx + j, dxv);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float xhat = (xv[k] - m) * s;
      dxv[k] += (dyv[k] * wv[k] - g_mean - xhat * g_xhat_mean) * s;
    }
    StoreVec(dx + j, dxv);
  }
}

absl::Status CheckBf16Shape(int n, int c) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(n, "layernorm", "n"));
  return internal::CheckMultipleOf8(c, "layernorm", "c");
}

}  // namespace

absl::Status LayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp,
                              const bf16* weight, const bf16* bias, int n, int c,
                              cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckBf16Shape(n, c));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "layernorm", {internal::Aligned16(out, "out"), internal::NotNull(mean, "mean"),
                    internal::NotNull(rstd, "rstd"), internal::Aligned16(inp, "inp"),
                    internal::Aligned16(weight, "weight"), internal::Aligned16(bias, "bias")}));
  if (internal::UsesOnePassNorm(c)) {
    return internal::Launch(LayerNormForwardRowKernel, n, internal::OnePassNormRowThreads(c), 0,
                            stream, out, mean, rstd, inp, weight, bias, c);
  }
  const int blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  return internal::Launch(LayerNormForwardKernel, blocks, internal::kBlockSize, 0, stream, out,
                          mean, rstd, inp, weight, bias, n, c);
}

size_t LayerNormBackwardScratchFloats(int n, int c) {
  return internal::NormBackwardScratchFloats(n, c, /*with_bias=*/true);
}

absl::Status LayerNormBackward(bf16* dinp, float* dweight, float* dbias, const bf16* dout,
                               const bf16* inp, const bf16* weight, const float* mean,
                               const float* rstd, float* scratch, int n, int c,
                               cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(CheckBf16Shape(n, c));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "layernorm backward",
      {internal::Aligned16(dinp, "dinp"), internal::NotNull(dweight, "dweight"),
       internal::NotNull(dbias, "dbias"), internal::Aligned16(dout, "dout"),
       internal::Aligned16(inp, "inp"), internal::Aligned16(weight, "weight"),
       internal::NotNull(mean, "mean"), internal::NotNull(rstd, "rstd"),
       internal::NotNull(scratch, "scratch")}));
  if (internal::UsesOnePassNorm(c)) {
    return internal::LaunchNormBackwardOnePass<true>(dinp, dweight, dbias, dout, inp, weight,
                                                     mean, rstd, scratch, n, c, stream);
  }
  const int blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(LayerNormBackwardInputKernel, blocks,
                                             internal::kBlockSize, 0, stream, dinp, dout, inp,
                                             weight, mean, rstd, n, c));
  return internal::LaunchNormParamGrad(dweight, dbias, dout, inp, mean, rstd, scratch, n, c,
                                       stream);
}

}  // namespace weft::engine::cuda
