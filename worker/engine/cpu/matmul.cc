// Matmul (a Linear layer): out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC).
// Weights are stored (OC, C) like PyTorch's Linear and llm.c, so checkpoints map one-to-one.
//
// Contract: the backward ACCUMULATES (+=) into dinp, dweight and dbias (GEMM with beta = 1).
// All three products go through BLAS; the bias reduction is a serial loop in fixed order.
#include <cstddef>

#include "worker/engine/cpu/blas.h"
#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int n, int c, int oc) {
  // out (N, OC) = inp (N, C) @ weight^T (C, OC)
  Gemm(false, true, n, oc, c, T(1), inp, c, weight, c, T(0), out, oc);
  if (bias == nullptr) return;
  for (int i = 0; i < n; ++i) {
    T* out_row = out + static_cast<size_t>(i) * oc;  // (OC)
    for (int o = 0; o < oc; ++o) out_row[o] += bias[o];
  }
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int n, int c, int oc) {
  // dinp (N, C) += dout (N, OC) @ weight (OC, C)
  Gemm(false, false, n, c, oc, T(1), dout, oc, weight, c, T(1), dinp, c);
  // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
  Gemm(true, false, oc, c, n, T(1), dout, oc, inp, c, T(1), dweight, c);
  if (dbias == nullptr) return;
  // dbias (OC) += sum over rows of dout; row-major order keeps the inner loop contiguous.
  for (int i = 0; i < n; ++i) {
    const T* dout_row = dout + static_cast<size_t>(i) * oc;  // (OC)
    for (int o = 0; o < oc; ++o) dbias[o] += dout_row[o];
  }
}

template void MatmulForward<float>(float*, const float*, const float*, const float*, int, int, int);
template void MatmulForward<double>(double*, const double*, const double*, const double*, int, int,
                                    int);
template void MatmulBackward<float>(float*, float*, float*, const float*, const float*,
                                    const float*, int, int, int);
template void MatmulBackward<double>(double*, double*, double*, const double*, const double*,
                                     const double*, int, int, int);

}  // namespace weft::engine::cpu
