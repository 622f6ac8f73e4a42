// AdamW on a device-resident flat shard: the kernel and its launcher (adamw.cc folds the
// AdamWConfig and the bias corrections into scalars). Same per-element math as
// engine::AdamWUpdate (worker/engine/adamw.cc):
//   g = grad_scale * grads[i]; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
//   p = p - lr * (m / c1) / (sqrt(v / c2) + eps) - lr * wd * p_old * (mask[i] != 0)
// Elementwise, so independent of the sharding; results match the CPU op to a few ulp (nvcc
// contracts multiply-adds into FMAs, the CPU build does not).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

__global__ void AdamWKernel(float* __restrict__ params,              // (n)
                            const float* __restrict__ grads,         // (n)
                            float* __restrict__ m,                   // (n)
                            float* __restrict__ v,                   // (n)
                            const uint8_t* __restrict__ decay_mask,  // (n)
                            int64_t n, float lr, float beta1, float beta2, float eps,
                            float lr_wd, float correction1, float correction2,
                            float grad_scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / correction1;
    const float v_hat = vi / correction2;
    const float p = params[i];
    // Decay reads the parameter before the Adam step, as PyTorch's AdamW and the CPU op.
    const float decay = decay_mask[i] != 0 ? lr_wd * p : 0.0f;
    params[i] = (p - lr * m_hat / (sqrtf(v_hat) + eps)) - decay;
  }
}

}  // namespace

namespace internal {

absl::Status LaunchAdamW(float* params, const float* grads, float* m, float* v,
                         const uint8_t* decay_mask, size_t n, float lr, float beta1, float beta2,
                         float eps, float lr_wd, float correction1, float correction2,
                         float grad_scale, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  const int64_t count = static_cast<int64_t>(n);
  AdamWKernel<<<GridFor(count), kBlockSize, 0, stream>>>(params, grads, m, v, decay_mask, count,
                                                         lr, beta1, beta2, eps, lr_wd,
                                                         correction1, correction2, grad_scale);
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace weft::engine::cuda
