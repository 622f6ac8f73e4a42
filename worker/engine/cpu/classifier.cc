// Classifier loss: softmax over the vocabulary + cross-entropy, fused forward and backward,
// and LmHeadForward, the LM-head matmul (tied or not) followed by it.
//
//   p = softmax(logits[:V]); loss_i = -log p[target_i]; loss = mean_i loss_i
//   d(loss_scale * loss)/dlogits[i, j] = loss_scale / N * (p[j] - [j == target_i])  (j < V)
//
// Contract: works IN PLACE — logits (N, Vp) in, the gradient out — because the logits are the
// largest activation (N x 50304 for GPT-2) and only their gradient is needed afterwards.
// Columns >= V (vocabulary padding) are excluded from the softmax as if they were -inf, so
// their gradient is exactly 0 (padding rows of the tied wte never move) and the loss equals
// the unpadded loss. loss_scale lets data-parallel ranks and gradient accumulation pre-scale
// the gradient (each rank passes 1 / (world * accum)); the returned loss is never scaled.
// Targets must be in [0, V) (the data layer validates), or negative: ignored (Hugging Face's
// labels = -100), loss 0 and gradient 0 but still counted in N (the engine rescales by the
// number of targets that count over the global batch: worker/zero/training_engine.h).
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
double SoftmaxCrossEntropyForwardBackward(T* logits, T* losses, const int32_t* targets, int n,
                                          int v, int vp, T loss_scale) {
  const T grad_scale = loss_scale / T(n);
  double loss_sum = 0;  // serial, fixed order: the mean is bit-identical run to run
  for (int i = 0; i < n; ++i) {
    T* row = logits + static_cast<size_t>(i) * vp;  // (Vp)
    if (targets[i] < 0) {
      losses[i] = 0;
      for (int j = 0; j < vp; ++j) row[j] = 0;
      continue;
    }
    T max_val = row[0];
    for (int j = 1; j < v; ++j) max_val = row[j] > max_val ? row[j] : max_val;
    const int target = targets[i];
    // log-sum-exp from the max-shifted row; taking the target's logit before the row is
    // overwritten keeps the loss finite even when p[target] underflows to 0.
    const T target_shifted = row[target] - max_val;
    T sum = 0;
    for (int j = 0; j < v; ++j) {
      row[j] = std::exp(row[j] - max_val);
      sum += row[j];
    }
    losses[i] = std::log(sum) - target_shifted;
    const T inv_sum = T(1) / sum;
    for (int j = 0; j < v; ++j) row[j] = row[j] * inv_sum * grad_scale;
    row[target] -= grad_scale;
    for (int j = v; j < vp; ++j) row[j] = 0;
    loss_sum += static_cast<double>(losses[i]);
  }
  return loss_sum / n;
}

template <typename T>
double LmHeadForward(T* logits, T* losses, const T* inp, const T* weight, const int32_t* targets,
                     int n, int c, int v, int vp, T loss_scale) {
  MatmulForward(logits, inp, weight, static_cast<const T*>(nullptr), n, c, vp);
  if (targets == nullptr) return 0;
  return SoftmaxCrossEntropyForwardBackward(logits, losses, targets, n, v, vp, loss_scale);
}

template double SoftmaxCrossEntropyForwardBackward<float>(float*, float*, const int32_t*, int, int,
                                                          int, float);
template double SoftmaxCrossEntropyForwardBackward<double>(double*, double*, const int32_t*, int,
                                                           int, int, double);

template double LmHeadForward<float>(float*, float*, const float*, const float*, const int32_t*,
                                     int, int, int, int, float);
template double LmHeadForward<double>(double*, double*, const double*, const double*,
                                      const int32_t*, int, int, int, int, double);

}  // namespace weft::engine::cpu
