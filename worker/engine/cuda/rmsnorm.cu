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
// In bf16: C % 8 == 0, rows read as 16-byte vectors, fp32 math. The forward is a block per row
// up to 8192 wide (the row held in registers), wider a warp per row (the sum of squares a warp
// butterfly, then the row read again from L1 for the output). The backward
// (norm.cuh) is one pass up to 8192 wide; wider, a warp per row for dx and a column
// reduction for dweight. The dweight sums run in a fixed order: bit-identical run to run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/norm.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using internal::kVec;
using internal::kWarpSize;
using internal::LoadVec;
using internal::StoreVec;
using internal::WarpSum;

constexpr int kForwardWarps = internal::kBlockSize / kWarpSize;  // rows a block (a warp each)
// A lane's successive 8-channel vectors of a row are this many channels apart.
constexpr int kRowStep = kWarpSize * kVec;

// The forward of rows wider than the one-pass kernel below takes: a warp per row.
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

// The forward for rows up to internal::kOnePassNormMaxWidth wide: a block per row, 8 channels
// a thread, the row read once and kept in registers (the warp-per-row kernel above reads it
// twice, once from L1: 1.8 TB/s at 8192 x 4096 on an H100).
__global__ void __launch_bounds__(internal::kOnePassNormMaxBlockThreads)
    RmsNormForwardRowKernel(bf16* __restrict__ out,           // (N, C)
                            float* __restrict__ rstd,         // (N)
                            const bf16* __restrict__ inp,     // (N, C)
                            const bf16* __restrict__ weight,  // (C)
                            int c, float eps) {
  __shared__ float partial[internal::kOnePassNormMaxBlockThreads / kWarpSize];
  const int64_t at = static_cast<int64_t>(blockIdx.x) * c + threadIdx.x * kVec;
  const bool has_col = static_cast<int>(threadIdx.x) * kVec < c;
  float x[kVec] = {};
  if (has_col) LoadVec(inp + at, x);
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) squares += x[k] * x[k];
  const float r =
      1.0f / sqrtf(internal::BlockSum(squares, partial) / static_cast<float>(c) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  if (!has_col) return;
  float w[kVec];
  LoadVec(weight + threadIdx.x * kVec, w);
#pragma unroll
  for (int k = 0; k < kVec; ++k) x[k] = x[k] * r * w[k];
  StoreVec(out + at, x);
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

// dx += rstd * (g - xhat * mean(g * xhat)); a warp per row, the row read twice (the second
// time from L1 or L2). kForwardWarps rows a block. Rows wider than the one-pass backward takes.
__global__ void RmsNormBackwardInputKernel(bf16* __restrict__ dinp,          // (N, C) +=
                                           const bf16* __restrict__ dout,    // (N, C)
                                           const bf16* __restrict__ inp,     // (N, C)
                                           const bf16* __restrict__ weight,  // (C)
                                           const float* __restrict__ rstd,   // (N)
                                           int n, int c) {
  const int row = blockIdx.x * kForwardWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= n) return;  // the whole warp leaves together
  const size_t base = static_cast<size_t>(row) * c;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int j = lane * kVec; j < c; j += kRowStep) {
    RowVectors v;
    v.Load(inp + base + j, dout + base + j, weight + j);
#pragma unroll
    for (int k = 0; k < kVec; ++k) dot += v.dy[k] * v.w[k] * (v.x[k] * r);
  }
  const float mean_dot = WarpSum(dot) * (1.0f / static_cast<float>(c));
  for (int j = lane * kVec; j < c; j += kRowStep) {
    RowVectors v;
    v.Load(inp + base + j, dout + base + j, weight + j);
    float dx[kVec];
    LoadVec(dinp + base + j, dx);
#pragma unroll
    for (int k = 0; k < kVec; ++k) dx[k] += r * (v.dy[k] * v.w[k] - v.x[k] * r * mean_dot);
    StoreVec(dinp + base + j, dx);
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
  if (internal::UsesOnePassNorm(c)) {
    return internal::Launch(RmsNormForwardRowKernel, n, internal::OnePassNormRowThreads(c), 0,
                            stream, out, rstd, inp, weight, c, eps);
  }
  const int blocks = (n + kForwardWarps - 1) / kForwardWarps;
  return internal::Launch(RmsNormForwardKernel, blocks, internal::kBlockSize, 0, stream, out,
                          rstd, inp, weight, n, c, eps);
}

size_t RmsNormBackwardScratchFloats(int n, int c) {
  return internal::NormBackwardScratchFloats(n, c, /*with_bias=*/false);
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
  if (internal::UsesOnePassNorm(c)) {
    return internal::LaunchNormBackwardOnePass<false>(dinp, dweight, nullptr, dout, inp, weight,
                                                      nullptr, rstd, scratch, n, c, stream);
  }
  const int blocks = (n + kForwardWarps - 1) / kForwardWarps;
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(RmsNormBackwardInputKernel, blocks,
                                             internal::kBlockSize, 0, stream, dinp, dout, inp,
                                             weight, rstd, n, c));
  return internal::LaunchNormParamGrad(dweight, nullptr, dout, inp, nullptr, rstd, scratch, n, c,
                                       stream);
}

}  // namespace weft::engine::cuda
