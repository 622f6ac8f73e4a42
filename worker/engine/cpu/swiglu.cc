// SwiGLU (Llama's MLP activation): out = silu(gate) * up, silu(g) = g * sigmoid(g), where each
// input row is [gate (I) | up (I)] (one GEMM with the stacked gate_up weight produces it).
//
// Contract: the backward ACCUMULATES (+=) into dinp (both halves) and reads only the input.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void SwiGluForward(T* out, const T* inp, int64_t n, int i) {
  for (int64_t r = 0; r < n; ++r) {
    const T* gate = inp + static_cast<size_t>(r) * 2 * i;  // (I)
    const T* up = gate + i;                                // (I)
    T* y = out + static_cast<size_t>(r) * i;               // (I)
    for (int j = 0; j < i; ++j) {
      const T silu = gate[j] / (T(1) + std::exp(-gate[j]));
      y[j] = silu * up[j];
    }
  }
}

template <typename T>
void SwiGluBackward(T* dinp, const T* dout, const T* inp, int64_t n, int i) {
  for (int64_t r = 0; r < n; ++r) {
    const T* gate = inp + static_cast<size_t>(r) * 2 * i;  // (I)
    const T* up = gate + i;                                // (I)
    const T* dy = dout + static_cast<size_t>(r) * i;       // (I)
    T* dgate = dinp + static_cast<size_t>(r) * 2 * i;      // (I)
    T* dup = dgate + i;                                    // (I)
    for (int j = 0; j < i; ++j) {
      const T g = gate[j];
      const T sig = T(1) / (T(1) + std::exp(-g));
      // d silu / dg = sig * (1 + g * (1 - sig))
      dgate[j] += dy[j] * up[j] * sig * (T(1) + g * (T(1) - sig));
      dup[j] += dy[j] * g * sig;
    }
  }
}

template void SwiGluForward<float>(float*, const float*, int64_t, int);
template void SwiGluForward<double>(double*, const double*, int64_t, int);
template void SwiGluBackward<float>(float*, const float*, const float*, int64_t, int);
template void SwiGluBackward<double>(double*, const double*, const double*, int64_t, int);

}  // namespace weft::engine::cpu
