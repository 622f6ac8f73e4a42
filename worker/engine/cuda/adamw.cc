// Host half of the CUDA AdamW: reads AdamWConfig (whose header pulls in protobuf, which nvcc
// is kept away from) and computes the bias corrections in double exactly as the CPU op does,
// then launches the kernel in adamw.cu.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/engine/adamw.h"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {

absl::Status AdamWUpdate(float* params, bf16* params_bf16, const float* grads, float* m,
                         float* v, size_t n, bool decay, const AdamWConfig& config, int64_t step,
                         const float* grad_scale, cudaStream_t stream) {
  if (step < 1) return absl::InvalidArgumentError("adamw: step is 1-based");
  // In double, as the CPU op: 1 - beta2^step for small steps would lose most of its digits in
  // float.
  const internal::AdamWScalars scalars = {
      config.lr,
      config.beta1,
      config.beta2,
      config.eps,
      config.lr * config.weight_decay,
      static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), step)),
      static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), step))};
  return internal::LaunchAdamW(params, params_bf16, grads, m, v, n, decay, scalars, grad_scale,
                               stream);
}

}  // namespace weft::engine::cuda
