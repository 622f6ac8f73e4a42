// LayerNorm over the last dimension: out = (x - mean) * rstd * weight + bias, with
// rstd = 1 / sqrt(var + 1e-5) and the biased (population) variance, as GPT-2.
//
// Contract: the forward keeps mean and rstd (N) so the backward need not recompute them. The
// backward ACCUMULATES (+=) into dinp, dweight and dbias.
#include <cmath>
#include <cstddef>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int n,
                      int c) {
  for (int i = 0; i < n; ++i) {
    const T* x = inp + static_cast<size_t>(i) * c;  // (C)
    T* y = out + static_cast<size_t>(i) * c;        // (C)
    T sum = 0;
    for (int j = 0; j < c; ++j) sum += x[j];
    const T m = sum / c;
    // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels
    // badly when |mean| >> std, as it can on the residual stream.
    T var_sum = 0;
    for (int j = 0; j < c; ++j) var_sum += (x[j] - m) * (x[j] - m);
    const T s = T(1) / std::sqrt(var_sum / c + T(kLayerNormEps));
    for (int j = 0; j < c; ++j) y[j] = (x[j] - m) * s * weight[j] + bias[j];
    mean[i] = m;
    rstd[i] = s;
  }
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int n, int c) {
  for (int i = 0; i < n; ++i) {
    const T* x = inp + static_cast<size_t>(i) * c;    // (C)
    const T* dy = dout + static_cast<size_t>(i) * c;  // (C)
    T* dx = dinp + static_cast<size_t>(i) * c;        // (C)
    const T m = mean[i];
    const T s = rstd[i];
    // With xhat = (x - mean) * rstd and g = dy * weight (the gradient w.r.t. xhat):
    //   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    T g_mean = 0;
    T g_xhat_mean = 0;
    for (int j = 0; j < c; ++j) {
      const T xhat = (x[j] - m) * s;
      const T g = dy[j] * weight[j];
      g_mean += g;
      g_xhat_mean += g * xhat;
    }
    g_mean /= c;
    g_xhat_mean /= c;
    for (int j = 0; j < c; ++j) {
      const T xhat = (x[j] - m) * s;
      const T g = dy[j] * weight[j];
      dbias[j] += dy[j];
      dweight[j] += xhat * dy[j];
      dx[j] += (g - g_mean - xhat * g_xhat_mean) * s;
    }
  }
}

template void LayerNormForward<float>(float*, float*, float*, const float*, const float*,
                                      const float*, int, int);
template void LayerNormForward<double>(double*, double*, double*, const double*, const double*,
                                       const double*, int, int);
template void LayerNormBackward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, int, int);
template void LayerNormBackward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, const double*, const double*, int, int);

}  // namespace weft::engine::cpu
