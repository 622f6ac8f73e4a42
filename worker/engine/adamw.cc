// AdamW, the local sum of squares for the global grad norm, and the LR schedule.
#include "worker/engine/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

namespace weft::engine {

AdamWConfig AdamWConfigFromSpec(const weft::v1::OptimizerSpec& spec, double lr) {
  AdamWConfig config;
  config.lr = static_cast<float>(lr);
  config.beta1 = static_cast<float>(spec.has_beta1() ? spec.beta1() : 0.9);
  config.beta2 = static_cast<float>(spec.has_beta2() ? spec.beta2() : 0.95);
  config.eps = static_cast<float>(spec.has_epsilon() ? spec.epsilon() : 1e-8);
  config.weight_decay = static_cast<float>(spec.has_weight_decay() ? spec.weight_decay() : 0.1);
  return config;
}

namespace {

// The bf16 bit pattern nearest x, as a select rather than a branch so the loops below vectorize.
inline uint16_t RoundToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded);
}

// AdamWUpdate, and with kBf16 each new parameter's bf16 pattern in the same pass: the host
// step of offload is bound by memory traffic, and a second pass would read the parameters
// back from DRAM. One body for both, so they round identically.
template <bool kBf16>
__attribute__((always_inline)) inline void Update(float* __restrict params, const float* __restrict grads, float* __restrict m,
            float* __restrict v, const uint8_t* __restrict decay_mask, size_t n,
            const AdamWConfig& config, int64_t step, float grad_scale,
            uint16_t* __restrict bf16_out) {
  if (std::isnan(grad_scale)) {  // a skipped step (GradScaleFor): nothing moves
    if constexpr (kBf16) {
      for (size_t i = 0; i < n; ++i) bf16_out[i] = RoundToBf16(params[i]);
    }
    return;
  }
  // Bias corrections in double: beta2^step approaches 1 - tiny for small steps, where float
  // would lose most of the digits of 1 - beta2^step.
  const float correction1 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), step));
  const float correction2 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), step));
  const float lr = config.lr;
  const float b1 = config.beta1;
  const float b2 = config.beta2;
  const float eps = config.eps;
  const float lr_wd = config.lr * config.weight_decay;
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i] * grad_scale;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / correction1;
    const float v_hat = vi / correction2;
    float p = params[i];
    // Decay reads the parameter before the Adam step, as PyTorch's AdamW does. It is
    // multiplied by min(mask, 1), 0 or 1, rather than branched on, because GCC vectorizes this
    // form (not `mask != 0`); x * 1 and p - 0 are exact, so the result is the branch's.
    const float decay = lr_wd * p * static_cast<float>(decay_mask[i] < 1 ? decay_mask[i] : 1);
    p -= lr * m_hat / (std::sqrt(v_hat) + eps);
    p -= decay;
    params[i] = p;
    if constexpr (kBf16) bf16_out[i] = RoundToBf16(p);
  }
}

// The host step's chunk, compiled also for AVX2 and AVX-512 and picked at load time for the
// CPU it runs on (the engine's baseline is x86-64-v2, 4 floats a vector): the step is partly
// bound by arithmetic (16 threads run it 1.4x faster than 8 on an H200 host). With
// -ffp-contract=off no clone fuses a multiply-add, and +, *, / and sqrt round the same at any
// vector width, so every clone gives the baseline's values bit for bit.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
UpdateWithBf16(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
               size_t n, const AdamWConfig& config, int64_t step, float grad_scale,
               uint16_t* bf16_out) {
  Update<true>(params, grads, m, v, decay_mask, n, config, step, grad_scale, bf16_out);
}

}  // namespace

void AdamWUpdate(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
                 size_t n, const AdamWConfig& config, int64_t step, float grad_scale) {
  Update<false>(params, grads, m, v, decay_mask, n, config, step, grad_scale, nullptr);
}

uint16_t Bf16Bits(float x) { return RoundToBf16(x); }

float GradScaleFor(double grad_norm, double clip) {
  if (!std::isfinite(grad_norm)) return std::numeric_limits<float>::quiet_NaN();
  return clip > 0 && grad_norm > clip ? static_cast<float>(clip / grad_norm) : 1.0f;
}

void AdamWUpdateParallel(float* params, const float* grads, float* m, float* v,
                         const uint8_t* decay_mask, size_t n, const AdamWConfig& config,
                         int64_t step, float grad_scale, uint16_t* bf16_out, int threads) {
  const size_t parts = static_cast<size_t>(std::max(1, threads));
  // Chunks of whole cache lines, so no two threads write one.
  const size_t chunk = ((n + parts - 1) / parts + 15) / 16 * 16;
  const auto run = [&](size_t begin) {
    const size_t end = std::min(n, begin + chunk);
    if (begin >= end) return;
    UpdateWithBf16(params + begin, grads + begin, m + begin, v + begin, decay_mask + begin,
                   end - begin, config, step, grad_scale, bf16_out + begin);
  };
  std::vector<std::thread> workers;
  for (size_t begin = chunk; begin < n; begin += chunk) workers.emplace_back(run, begin);
  run(0);
  for (std::thread& t : workers) t.join();
}

double SumOfSquares(const float* x, size_t n) {
  // Eight independent partial sums: the compiler can keep them in registers in parallel (a
  // single accumulator chain is latency-bound), and the order stays fixed.
  double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) {
      const double xi = x[i + k];
      partial[k] += xi * xi;
    }
  }
  for (; i < n; ++i) partial[0] += static_cast<double>(x[i]) * x[i];
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

double LearningRate(const weft::v1::JobSpec& spec, int64_t step) {
  const double peak = spec.optimizer().learning_rate();
  const weft::v1::LrSchedule& schedule = spec.lr_schedule();
  const int64_t warmup = schedule.warmup_steps();
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (schedule.kind() == weft::v1::LrSchedule::CONSTANT) return peak;
  const double min_lr = peak * (schedule.has_min_lr_ratio() ? schedule.min_lr_ratio() : 0.1);
  const int64_t decay_steps = spec.training().total_steps() - warmup;
  if (decay_steps <= 0) return min_lr;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(decay_steps);
  if (progress > 1.0) progress = 1.0;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (peak - min_lr);
}

}  // namespace weft::engine
