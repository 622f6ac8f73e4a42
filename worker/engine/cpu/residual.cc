// Residual: out = inp1 + inp2.
//
// Contract: the backward ACCUMULATES (+=) dout into both dinp1 and dinp2. The model's block
// backward does not call it: there the residual stream's gradient buffer is both dout and
// dinp1 (the branch accumulates into it), which saves a copy per residual; this op keeps the
// layer set complete for tests and for the CUDA parity checks.
#include <cstdint>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void ResidualForward(T* out, const T* inp1, const T* inp2, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp1[i] + inp2[i];
}

template <typename T>
void ResidualBackward(T* dinp1, T* dinp2, const T* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

template void ResidualForward<float>(float*, const float*, const float*, int64_t);
template void ResidualForward<double>(double*, const double*, const double*, int64_t);
template void ResidualBackward<float>(float*, float*, const float*, int64_t);
template void ResidualBackward<double>(double*, double*, const double*, int64_t);

}  // namespace weft::engine::cpu
