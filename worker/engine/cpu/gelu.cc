// GELU, tanh approximation (GPT-2's):
//   gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
//
// Contract: the backward recomputes from the input (no extra activation kept) and
// ACCUMULATES (+=) into dinp.
#include <cmath>
#include <cstdint>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;

// tanh through one exp: glibc's tanhf goes through expm1f and made GELU ~40% of a small
// model's step. The cancellation near u = 0 costs absolute accuracy only (~1 ulp of 1), which
// is what matters here since the result is added to 1. Overflow is benign: exp -> inf gives 1.
template <typename T>
T Tanh(T u) {
  return T(1) - T(2) / (std::exp(T(2) * u) + T(1));
}

}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T u = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
    out[i] = T(0.5) * x * (T(1) + Tanh(u));
  }
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T u = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
    const T th = Tanh(u);
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx
    const T du_dx = T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x);
    const T local = T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du_dx;
    dinp[i] += local * dout[i];
  }
}

template void GeluForward<float>(float*, const float*, int64_t);
template void GeluForward<double>(double*, const double*, int64_t);
template void GeluBackward<float>(float*, const float*, const float*, int64_t);
template void GeluBackward<double>(double*, const double*, const double*, int64_t);

}  // namespace weft::engine::cpu
