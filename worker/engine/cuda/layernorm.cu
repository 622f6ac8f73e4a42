// LayerNorm over the last dimension: out = (x - mean) * rstd * weight + bias, with
// rstd = 1 / sqrt(var + 1e-5) and the biased variance, as cpu/layernorm.cc.
//
// Contract: the forward keeps mean and rstd (N) for the backward; the backward ACCUMULATES
// (+=) into dinp, dweight and dbias.
//
// One warp per row for the row statistics (two passes, mean then squared deviations, as the
// CPU op, which stays accurate when |mean| >> std). The sums are taken in a different order
// than the CPU's serial loop, hence ~1e-6 relative differences. dweight/dbias are reduced
// over rows by one thread per channel in row order (deterministic, no atomics); a
// block-partial two-stage reduction is the follow-up for speed.
#include <cuda_runtime.h>

#include <cstdint>

#include "worker/engine/cpu/ops.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using internal::kWarpSize;
using internal::WarpSum;

constexpr int kRowsPerBlock = internal::kBlockSize / kWarpSize;
constexpr float kEps = static_cast<float>(cpu::kLayerNormEps);

__global__ void LayerNormForwardKernel(float* __restrict__ out,           // (N, C)
                                       float* __restrict__ mean,          // (N)
                                       float* __restrict__ rstd,          // (N)
                                       const float* __restrict__ inp,     // (N, C)
                                       const float* __restrict__ weight,  // (C)
                                       const float* __restrict__ bias,    // (C)
                                       int n, int c) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= n) return;  // whole warps exit together, so the shuffles below stay full-warp
  const float* x = inp + static_cast<int64_t>(row) * c;  // (C)
  float* y = out + static_cast<int64_t>(row) * c;        // (C)
  float sum = 0.0f;
  for (int j = lane; j < c; j += kWarpSize) sum += x[j];
  const float m = WarpSum(sum) / c;
  float var_sum = 0.0f;
  for (int j = lane; j < c; j += kWarpSize) {
    const float d = x[j] - m;
    var_sum += d * d;
  }
  const float s = 1.0f / sqrtf(WarpSum(var_sum) / c + kEps);
  for (int j = lane; j < c; j += kWarpSize) y[j] = (x[j] - m) * s * weight[j] + bias[j];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight, xhat = (x - mean) * rstd.
__global__ void LayerNormBackwardInputKernel(float* __restrict__ dinp,          // (N, C) +=
                                             const float* __restrict__ dout,    // (N, C)
                                             const float* __restrict__ inp,     // (N, C)
                                             const float* __restrict__ weight,  // (C)
                                             const float* __restrict__ mean,    // (N)
                                             const float* __restrict__ rstd,    // (N)
                                             int n, int c) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= n) return;
  const int64_t offset = static_cast<int64_t>(row) * c;
  const float* x = inp + offset;    // (C)
  const float* dy = dout + offset;  // (C)
  float* dx = dinp + offset;        // (C)
  const float m = mean[row];
  const float s = rstd[row];
  float g_sum = 0.0f;
  float g_xhat_sum = 0.0f;
  for (int j = lane; j < c; j += kWarpSize) {
    const float xhat = (x[j] - m) * s;
    const float g = dy[j] * weight[j];
    g_sum += g;
    g_xhat_sum += g * xhat;
  }
  const float g_mean = WarpSum(g_sum) / c;
  const float g_xhat_mean = WarpSum(g_xhat_sum) / c;
  for (int j = lane; j < c; j += kWarpSize) {
    const float xhat = (x[j] - m) * s;
    const float g = dy[j] * weight[j];
    dx[j] += (g - g_mean - xhat * g_xhat_mean) * s;
  }
}

__global__ void LayerNormBackwardParamsKernel(float* __restrict__ dweight,     // (C) +=
                                              float* __restrict__ dbias,       // (C) +=
                                              const float* __restrict__ dout,  // (N, C)
                                              const float* __restrict__ inp,   // (N, C)
                                              const float* __restrict__ mean,  // (N)
                                              const float* __restrict__ rstd,  // (N)
                                              int n, int c) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c) return;
  // Accumulate onto the existing value in row order, as the CPU op does.
  float dw = dweight[j];
  float db = dbias[j];
  for (int i = 0; i < n; ++i) {
    const int64_t k = static_cast<int64_t>(i) * c + j;
    const float xhat = (inp[k] - mean[i]) * rstd[i];
    db += dout[k];
    dw += xhat * dout[k];
  }
  dweight[j] = dw;
  dbias[j] = db;
}

absl::Status CheckShape(int n, int c) {
  if (n < 0 || c < 0) return absl::InvalidArgumentError("layernorm: negative shape");
  return absl::OkStatus();
}

}  // namespace

absl::Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int n, int c,
                              cudaStream_t stream) {
  if (absl::Status s = CheckShape(n, c); !s.ok()) return s;
  if (n == 0 || c == 0) return absl::OkStatus();
  const int blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  LayerNormForwardKernel<<<blocks, internal::kBlockSize, 0, stream>>>(out, mean, rstd, inp,
                                                                      weight, bias, n, c);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int n, int c, cudaStream_t stream) {
  if (absl::Status s = CheckShape(n, c); !s.ok()) return s;
  if (n == 0 || c == 0) return absl::OkStatus();
  const int row_blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  LayerNormBackwardInputKernel<<<row_blocks, internal::kBlockSize, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, n, c);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const int channel_blocks = (c + internal::kBlockSize - 1) / internal::kBlockSize;
  LayerNormBackwardParamsKernel<<<channel_blocks, internal::kBlockSize, 0, stream>>>(
      dweight, dbias, dout, inp, mean, rstd, n, c);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace weft::engine::cuda
