// AdamW on a flat shard of parameters, the global gradient norm's local part, and the
// learning-rate schedule. Shard-local and elementwise, so ZeRO stages only change which slice
// each rank passes.
#ifndef WEFT_WORKER_ENGINE_ADAMW_H_
#define WEFT_WORKER_ENGINE_ADAMW_H_

#include <cstddef>
#include <cstdint>

#include "weft/v1/job.pb.h"

namespace weft::engine {

struct AdamWConfig {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// The optimizer settings of a spec at learning rate `lr` (from LearningRate); unset optional
// fields take job.proto's defaults (0.9, 0.95, 1e-8, 0.1).
AdamWConfig AdamWConfigFromSpec(const weft::v1::OptimizerSpec& spec, double lr);

// One AdamW step on n elements:
//   g = grad_scale * grads[i]
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / (1 - beta1^step) / (sqrt(v / (1 - beta2^step)) + eps) + wd * p * mask[i])
// Decay is decoupled (not part of g, so not seen by m and v) and applies only where
// decay_mask[i] != 0. `step` is 1-based (the bias corrections). grad_scale multiplies the
// gradients first: global-norm clipping passes min(1, clip / norm) (GradScaleFor). A NaN
// grad_scale skips the step: params, m and v are left as they are. Elementwise and serial, so
// the result is independent of how the parameters are sharded.
void AdamWUpdate(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
                 size_t n, const AdamWConfig& config, int64_t step, float grad_scale);

// The grad_scale every AdamW here takes for a step whose global gradient norm is `grad_norm`:
// min(1, clip / norm) when clipping (clip > 0) and the norm exceeds it, else 1; and NaN when
// the norm is not finite (a NaN or infinity in some gradient), which makes the update a no-op
// — a skipped step (fault.max_skipped_steps). The CUDA engine's ClipScale computes the same
// on the device.
float GradScaleFor(double grad_norm, double clip);

// AdamWUpdate over `threads` contiguous chunks at once (the same result: it is elementwise),
// each chunk's new parameters then rounded to bf16 into bf16_out (n bit patterns, round to
// nearest even as the GPU's __float2bfloat16 does): the host step of optimizer offload, whose
// bf16 output is the device's next working copy (written for a skipped step too, from the
// unchanged parameters). threads < 1 means 1.
void AdamWUpdateParallel(float* params, const float* grads, float* m, float* v,
                         const uint8_t* decay_mask, size_t n, const AdamWConfig& config,
                         int64_t step, float grad_scale, uint16_t* bf16_out, int threads);

// The bf16 bit pattern nearest x (ties to even; NaN stays NaN).
uint16_t Bf16Bits(float x);

// Sum of x[i]^2 in double, in a fixed order (bit-identical run to run). For the global grad
// norm: each rank sums its shard, an all-reduce adds the ranks', the norm is the square root.
double SumOfSquares(const float* x, size_t n);

// Learning rate at optimizer step `step` (0-based) from spec.optimizer.learning_rate,
// spec.lr_schedule and spec.training.total_steps:
//  - warmup: lr * (step + 1) / warmup_steps for step < warmup_steps — a linear ramp from 0
//    that reaches the peak on the last warmup step and never gives the first step a zero LR;
//  - then CONSTANT: lr; COSINE (also UNSPECIFIED): from lr at step == warmup_steps down to
//    min_lr_ratio * lr at step == total_steps, following half a cosine; steps past
//    total_steps stay at the floor.
double LearningRate(const weft::v1::JobSpec& spec, int64_t step);

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_ADAMW_H_
