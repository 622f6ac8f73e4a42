// The CUDA layers of GPT-2 (first increment: fp32, the CPU ops' math), each with its forward
// and backward in one .cu file per layer. Every pointer is DEVICE memory, dense row-major,
// with the shapes of worker/engine/cpu/ops.h (N = B * T positions, C channels, Vp padded
// vocabulary).
//
// Contract, the CPU ops' (so the two backends are interchangeable and testable against each
// other):
//  - Parameter gradients ACCUMULATE (+=), and so do input gradients; a caller that wants
//    plain gradients zeroes the buffer first.
//  - Nothing is written but the outputs / gradient buffers named.
//  - Every launcher enqueues on `stream` (taken LAST) and returns without synchronizing.
//    Its absl::Status reports argument errors and launch errors (cudaGetLastError after the
//    launch); an error in a kernel's execution surfaces at the caller's next synchronization.
//  - Gradient reductions run in a fixed order (no atomics), so results are bit-identical run
//    to run, like the CPU engine. The encoder and LayerNorm parameter-gradient reductions are
//    correct but serial per channel; faster deterministic reductions are a follow-up.
#ifndef WEFT_WORKER_ENGINE_CUDA_OPS_H_
#define WEFT_WORKER_ENGINE_CUDA_OPS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace weft::engine {
struct AdamWConfig;  // worker/engine/adamw.h; not included so nvcc never parses protobuf.
}  // namespace weft::engine

namespace weft::engine::cuda {

// ---- encoder.cu: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :] ----
absl::Status EncoderForward(float* out,             // (B, T, C)
                            const int32_t* tokens,  // (B, T), each in [0, V), not checked
                            const float* wte,       // (Vp, C)
                            const float* wpe,       // (maxT, C), rows [0, T) used
                            int b, int t, int c, cudaStream_t stream);
absl::Status EncoderBackward(float* dwte,            // (Vp, C) +=
                             float* dwpe,            // (maxT, C) +=
                             const float* dout,      // (B, T, C)
                             const int32_t* tokens,  // (B, T)
                             int b, int t, int c, cudaStream_t stream);

// ---- layernorm.cu (eps = cpu::kLayerNormEps, biased variance) ----
absl::Status LayerNormForward(float* out,           // (N, C)
                              float* mean,          // (N) kept for backward
                              float* rstd,          // (N) kept for backward
                              const float* inp,     // (N, C)
                              const float* weight,  // (C)
                              const float* bias,    // (C)
                              int n, int c, cudaStream_t stream);
absl::Status LayerNormBackward(float* dinp,          // (N, C) +=
                               float* dweight,       // (C) +=
                               float* dbias,         // (C) +=
                               const float* dout,    // (N, C)
                               const float* inp,     // (N, C)
                               const float* weight,  // (C)
                               const float* mean,    // (N)
                               const float* rstd,    // (N)
                               int n, int c, cudaStream_t stream);

// ---- gelu.cu: tanh approximation, the CPU op's formula ----
absl::Status GeluForward(float* out,        // (N)
                         const float* inp,  // (N)
                         int64_t n, cudaStream_t stream);
absl::Status GeluBackward(float* dinp,        // (N) +=
                          const float* inp,   // (N)
                          const float* dout,  // (N)
                          int64_t n, cudaStream_t stream);

// ---- residual.cu: out = inp1 + inp2 ----
absl::Status ResidualForward(float* out,         // (N)
                             const float* inp1,  // (N)
                             const float* inp2,  // (N)
                             int64_t n, cudaStream_t stream);
absl::Status ResidualBackward(float* dinp1,       // (N) +=
                              float* dinp2,       // (N) +=
                              const float* dout,  // (N)
                              int64_t n, cudaStream_t stream);

// ---- adamw.cu + adamw.cc: engine::AdamWUpdate on a device-resident flat shard ----
// Same semantics as engine::AdamWUpdate (worker/engine/adamw.h): g = grad_scale * grads[i];
// decoupled decay where decay_mask[i] != 0, applied to the parameter before the Adam step;
// `step` 1-based; bias corrections computed in double on the host.
absl::Status AdamWUpdate(float* params,              // (n) updated
                         const float* grads,         // (n)
                         float* m,                   // (n) updated
                         float* v,                   // (n) updated
                         const uint8_t* decay_mask,  // (n)
                         size_t n, const AdamWConfig& config, int64_t step, float grad_scale,
                         cudaStream_t stream);

namespace internal {
// The AdamW kernel's launcher with the host-side scalars already folded (adamw.cu), so the
// .cu file needs no protobuf-dependent header. Callers use AdamWUpdate.
absl::Status LaunchAdamW(float* params, const float* grads, float* m, float* v,
                         const uint8_t* decay_mask, size_t n, float lr, float beta1, float beta2,
                         float eps, float lr_wd, float correction1, float correction2,
                         float grad_scale, cudaStream_t stream);
}  // namespace internal

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_OPS_H_
