// Causal multi-head self-attention core (the QKV and output projections are matmuls):
//   for each (b, head): att = softmax(mask(q @ k^T / sqrt(hs))), out = att @ v.
// qkv rows are [q | k | v], each C wide, head h owning channels [h*hs, (h+1)*hs) of each.
//
// Contract: the forward keeps the (B, NH, T, T) softmax `att` (zeros above the diagonal) for
// the backward, so attention memory is O(B * NH * T * T). The backward ACCUMULATES (+=) into
// dqkv and uses a (T, T) scratch.
//
// Why GEMM per (b, head) rather than loops: a head is a strided (T, hs) view of the qkv rows
// (row stride 3C), which BLAS takes directly through lda, so there are no copies, and BLAS is
// several times faster than scalar loops even though the full T x T score matrix is computed
// and its upper triangle then discarded (about twice the minimal score FLOPs). The (b, head)
// loop is serial and the softmax loops reduce in a fixed order; the only parallelism is inside
// BLAS (see blas.h for what that means for determinism).
#include <cmath>
#include <cstddef>

#include "worker/engine/cpu/blas.h"
#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int b, int t, int c, int nh) {
  const int hs = c / nh;
  const int c3 = 3 * c;
  const T scale = T(1) / std::sqrt(T(hs));
  for (int bi = 0; bi < b; ++bi) {
    for (int h = 0; h < nh; ++h) {
      const T* q = qkv + static_cast<size_t>(bi) * t * c3 + h * hs;  // (T, hs), stride 3C
      const T* k = q + c;                                            // (T, hs), stride 3C
      const T* v = q + 2 * c;                                        // (T, hs), stride 3C
      T* a = att + (static_cast<size_t>(bi) * nh + h) * t * t;       // (T, T)
      T* o = out + static_cast<size_t>(bi) * t * c + h * hs;         // (T, hs), stride C
      // a (T, T) = scale * q (T, hs) @ k^T (hs, T); the upper triangle is overwritten below.
      Gemm(false, true, t, t, hs, scale, q, c3, k, c3, T(0), a, t);
      for (int ti = 0; ti < t; ++ti) {
        T* row = a + static_cast<size_t>(ti) * t;  // (T)
        T max_val = row[0];
        for (int j = 1; j <= ti; ++j) max_val = row[j] > max_val ? row[j] : max_val;
        T sum = 0;
        for (int j = 0; j <= ti; ++j) {
          row[j] = std::exp(row[j] - max_val);
          sum += row[j];
        }
        const T inv_sum = T(1) / sum;
        for (int j = 0; j <= ti; ++j) row[j] *= inv_sum;
        // Exact zeros above the diagonal make `a @ v` below causal without a masked GEMM.
        for (int j = ti + 1; j < t; ++j) row[j] = 0;
      }
      // o (T, hs) = a (T, T) @ v (T, hs)
      Gemm(false, false, t, hs, t, T(1), a, t, v, c3, T(0), o, c);
    }
  }
}

template <typename T>
void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int b, int t,
                       int c, int nh) {
  const int hs = c / nh;
  const int c3 = 3 * c;
  const T scale = T(1) / std::sqrt(T(hs));
  for (int bi = 0; bi < b; ++bi) {
    for (int h = 0; h < nh; ++h) {
      const size_t head_off = static_cast<size_t>(bi) * t * c3 + h * hs;
      const T* q = qkv + head_off;                                        // (T, hs), stride 3C
      const T* k = q + c;                                                 // (T, hs), stride 3C
      const T* v = q + 2 * c;                                             // (T, hs), stride 3C
      T* dq = dqkv + head_off;                                            // (T, hs), stride 3C
      T* dk = dq + c;                                                     // (T, hs), stride 3C
      T* dv = dq + 2 * c;                                                 // (T, hs), stride 3C
      const T* a = att + (static_cast<size_t>(bi) * nh + h) * t * t;      // (T, T)
      const T* dout_h = dout + static_cast<size_t>(bi) * t * c + h * hs;  // (T, hs), stride C
      T* da = scratch;                                                    // (T, T)
      // da (T, T) = dout_h (T, hs) @ v^T (hs, T)
      Gemm(false, true, t, t, hs, T(1), dout_h, c, v, c3, T(0), da, t);
      // dv (T, hs) += a^T (T, T) @ dout_h (T, hs)
      Gemm(true, false, t, hs, t, T(1), a, t, dout_h, c, T(1), dv, c3);
      // Softmax backward in place: ds[j] = a[j] * (da[j] - sum_k a[k] da[k]) on the causal
      // part, 0 above the diagonal (masked scores have no gradient).
      for (int ti = 0; ti < t; ++ti) {
        const T* a_row = a + static_cast<size_t>(ti) * t;  // (T)
        T* d_row = da + static_cast<size_t>(ti) * t;       // (T)
        T dot = 0;
        for (int j = 0; j <= ti; ++j) dot += a_row[j] * d_row[j];
        for (int j = 0; j <= ti; ++j) d_row[j] = a_row[j] * (d_row[j] - dot);
        for (int j = ti + 1; j < t; ++j) d_row[j] = 0;
      }
      // Scores were scale * q @ k^T:
      // dq (T, hs) += scale * ds (T, T) @ k (T, hs)
      Gemm(false, false, t, hs, t, scale, da, t, k, c3, T(1), dq, c3);
      // dk (T, hs) += scale * ds^T (T, T) @ q (T, hs)
      Gemm(true, false, t, hs, t, scale, da, t, q, c3, T(1), dk, c3);
    }
  }
}

template void AttentionForward<float>(float*, float*, const float*, int, int, int, int);
template void AttentionForward<double>(double*, double*, const double*, int, int, int, int);
template void AttentionBackward<float>(float*, float*, const float*, const float*, const float*,
                                       int, int, int, int);
template void AttentionBackward<double>(double*, double*, const double*, const double*,
                                        const double*, int, int, int, int);

}  // namespace weft::engine::cpu
