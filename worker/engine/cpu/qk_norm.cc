// Qwen3's per-head RMSNorm of q and k: every q head and every k head of the qkv projection's
// output is RMS-normalized over its D values, all q heads by one weight q_weight (D) and all k
// heads by k_weight (D), before rotary embeddings; v is not normalized. Each head is exactly
// RmsNormForward / RmsNormBackward over a row of D (rmsnorm.cc), so the two norms round the
// same way in float.
//
// Contract: the forward normalizes IN PLACE in the (N, QKV) buffer (as rotary, which follows,
// rotates in place) and keeps the raw heads and their r for the backward, which transforms dq
// and dk IN PLACE (=, the gradient w.r.t. the raw heads) and ACCUMULATES (+=) the weights'
// gradients. v and dv are never touched.
#include <cstddef>
#include <vector>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void QkNormForward(T* qkv, T* qk_raw, T* rrms, const T* q_weight, const T* k_weight, int n, int nh,
                   int nkv, int d, double eps) {
  const int heads = nh + nkv;
  const size_t row_len = static_cast<size_t>(nh + 2 * nkv) * d;
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < heads; ++h) {
      const size_t slot = static_cast<size_t>(i) * heads + h;
      T* x = qkv + i * row_len + static_cast<size_t>(h) * d;  // (D), q heads then k heads
      T* raw = qk_raw + slot * d;                             // (D)
      for (int j = 0; j < d; ++j) raw[j] = x[j];
      RmsNormForward(x, rrms + slot, raw, h < nh ? q_weight : k_weight, 1, d, eps);
    }
  }
}

template <typename T>
void QkNormBackward(T* dqkv, T* dq_weight, T* dk_weight, const T* qk_raw, const T* rrms,
                    const T* q_weight, const T* k_weight, int n, int nh, int nkv, int d) {
  const int heads = nh + nkv;
  const size_t row_len = static_cast<size_t>(nh + 2 * nkv) * d;
  // RmsNormBackward accumulates into its input gradient: the head's dy moves here and the head
  // is zeroed, so what it adds is the gradient itself (=).
  std::vector<T> dy(d);
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < heads; ++h) {
      const size_t slot = static_cast<size_t>(i) * heads + h;
      T* dx = dqkv + i * row_len + static_cast<size_t>(h) * d;  // (D)
      for (int j = 0; j < d; ++j) {
        dy[j] = dx[j];
        dx[j] = 0;
      }
      const bool q = h < nh;
      RmsNormBackward(dx, q ? dq_weight : dk_weight, dy.data(), qk_raw + slot * d,
                      q ? q_weight : k_weight, rrms + slot, 1, d);
    }
  }
}

template void QkNormForward<float>(float*, float*, float*, const float*, const float*, int, int,
                                   int, int, double);
template void QkNormForward<double>(double*, double*, double*, const double*, const double*, int,
                                    int, int, int, double);
template void QkNormBackward<float>(float*, float*, float*, const float*, const float*,
                                    const float*, const float*, int, int, int, int);
template void QkNormBackward<double>(double*, double*, double*, const double*, const double*,
                                     const double*, const double*, int, int, int, int);

}  // namespace weft::engine::cpu
