// RMSNorm over the last dimension (Llama): out = x * r * weight, r = 1 / sqrt(mean(x^2) + eps).
// No mean subtraction and no bias. The product is formed as weight * (x * r), the order
// Hugging Face's LlamaRMSNorm uses, so fp32 results round the same way.
//
// Contract: the forward keeps r (N) so the backward need not recompute it. The backward
// ACCUMULATES (+=) into dinp and dweight.
#include <cmath>
#include <cstddef>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void RmsNormForward(T* out, T* rrms, const T* inp, const T* weight, int n, int c, double eps) {
  for (int i = 0; i < n; ++i) {
    const T* x = inp + static_cast<size_t>(i) * c;  // (C)
    T* y = out + static_cast<size_t>(i) * c;        // (C)
    T sum_sq = 0;
    for (int j = 0; j < c; ++j) sum_sq += x[j] * x[j];
    const T r = T(1) / std::sqrt(sum_sq / c + static_cast<T>(eps));
    for (int j = 0; j < c; ++j) y[j] = weight[j] * (x[j] * r);
    rrms[i] = r;
  }
}

template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rrms, int n, int c) {
  for (int i = 0; i < n; ++i) {
    const T* x = inp + static_cast<size_t>(i) * c;    // (C)
    const T* dy = dout + static_cast<size_t>(i) * c;  // (C)
    T* dx = dinp + static_cast<size_t>(i) * c;        // (C)
    const T r = rrms[i];
    // With g = dy * weight (the gradient w.r.t. x * r) and dr/dx_k = -r^3 x_k / C:
    //   dx = r * (g - x * r^2 * mean(g * x)).
    T gx_mean = 0;
    for (int j = 0; j < c; ++j) gx_mean += dy[j] * weight[j] * x[j];
    gx_mean /= c;
    const T coeff = r * r * gx_mean;
    for (int j = 0; j < c; ++j) {
      dweight[j] += dy[j] * (x[j] * r);
      dx[j] += (dy[j] * weight[j] - x[j] * coeff) * r;
    }
  }
}

template void RmsNormForward<float>(float*, float*, const float*, const float*, int, int, double);
template void RmsNormForward<double>(double*, double*, const double*, const double*, int, int,
                                     double);
template void RmsNormBackward<float>(float*, float*, const float*, const float*, const float*,
                                     const float*, int, int);
template void RmsNormBackward<double>(double*, double*, const double*, const double*, const double*,
                                      const double*, int, int);

}  // namespace weft::engine::cpu
