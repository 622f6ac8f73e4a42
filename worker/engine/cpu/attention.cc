// Causal self-attention core (the QKV and output projections are matmuls), multi-head and
// grouped-query: for each (b, query head h): att = softmax(mask(q_h @ k_g^T / sqrt(D))),
// out_h = att @ v_g, with g = h / (NH / NKV) the key/value head the query head shares.
// qkv rows are [q (NH * D) | k (NKV * D) | v (NKV * D)], head j owning channels
// [j*D, (j+1)*D) of its part; GPT-2 is NKV = NH, D = C / NH (rows [q | k | v], each C wide).
//
// Contract: the forward keeps the (B, NH, T, T) softmax `att` (zeros above the diagonal) for
// the backward, so attention memory is O(B * NH * T * T). The backward ACCUMULATES (+=) into
// dqkv and uses a (T, T) scratch; a shared key/value head's gradient sums its query heads'
// contributions in head order.
//
// Why GEMM per (b, head) rather than loops: a head is a strided (T, D) view of the qkv rows
// (row stride QKV), which BLAS takes directly through lda, so there are no copies (and a
// shared k/v head is read in place by every query head of its group, never repeated), and
// BLAS is several times faster than scalar loops even though the full T x T score matrix is
// computed and its upper triangle then discarded (about twice the minimal score FLOPs). The
// (b, head) loop is serial and the softmax loops reduce in a fixed order; the only parallelism
// is inside BLAS (see blas.h for what that means for determinism).
#include <cmath>
#include <cstddef>

#include "worker/engine/cpu/blas.h"
#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void GqaAttentionForward(T* out, T* att, const T* qkv, int b, int t, int nh, int nkv, int d) {
  const int row = (nh + 2 * nkv) * d;  // QKV
  const int q_width = nh * d;
  const int kv_width = nkv * d;
  const int group = nh / nkv;
  const T scale = T(1) / std::sqrt(T(d));
  for (int bi = 0; bi < b; ++bi) {
    for (int h = 0; h < nh; ++h) {
      const T* seq = qkv + static_cast<size_t>(bi) * t * row;
      const T* q = seq + h * d;                                    // (T, D), stride QKV
      const T* k = seq + q_width + (h / group) * d;                // (T, D), stride QKV
      const T* v = k + kv_width;                                   // (T, D), stride QKV
      T* a = att + (static_cast<size_t>(bi) * nh + h) * t * t;     // (T, T)
      T* o = out + static_cast<size_t>(bi) * t * q_width + h * d;  // (T, D), stride NH * D
      // a (T, T) = scale * q (T, D) @ k^T (D, T); the upper triangle is overwritten below.
      Gemm(false, true, t, t, d, scale, q, row, k, row, T(0), a, t);
      for (int ti = 0; ti < t; ++ti) {
        T* a_row = a + static_cast<size_t>(ti) * t;  // (T)
        T max_val = a_row[0];
        for (int j = 1; j <= ti; ++j) max_val = a_row[j] > max_val ? a_row[j] : max_val;
        T sum = 0;
        for (int j = 0; j <= ti; ++j) {
          a_row[j] = std::exp(a_row[j] - max_val);
          sum += a_row[j];
        }
        const T inv_sum = T(1) / sum;
        for (int j = 0; j <= ti; ++j) a_row[j] *= inv_sum;
        // Exact zeros above the diagonal make `a @ v` below causal without a masked GEMM.
        for (int j = ti + 1; j < t; ++j) a_row[j] = 0;
      }
      // o (T, D) = a (T, T) @ v (T, D)
      Gemm(false, false, t, d, t, T(1), a, t, v, row, T(0), o, q_width);
    }
  }
}

template <typename T>
void GqaAttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int b,
                          int t, int nh, int nkv, int d) {
  const int row = (nh + 2 * nkv) * d;  // QKV
  const int q_width = nh * d;
  const int kv_width = nkv * d;
  const int group = nh / nkv;
  const T scale = T(1) / std::sqrt(T(d));
  for (int bi = 0; bi < b; ++bi) {
    for (int h = 0; h < nh; ++h) {
      const size_t seq = static_cast<size_t>(bi) * t * row;
      const size_t q_off = seq + h * d;
      const size_t k_off = seq + q_width + (h / group) * d;
      const T* q = qkv + q_off;                                                // (T, D)
      const T* k = qkv + k_off;                                                // (T, D)
      const T* v = k + kv_width;                                               // (T, D)
      T* dq = dqkv + q_off;                                                    // (T, D)
      T* dk = dqkv + k_off;                                                    // (T, D)
      T* dv = dk + kv_width;                                                   // (T, D)
      const T* a = att + (static_cast<size_t>(bi) * nh + h) * t * t;           // (T, T)
      const T* dout_h = dout + static_cast<size_t>(bi) * t * q_width + h * d;  // (T, D)
      T* da = scratch;                                                         // (T, T)
      // da (T, T) = dout_h (T, D) @ v^T (D, T)
      Gemm(false, true, t, t, d, T(1), dout_h, q_width, v, row, T(0), da, t);
      // dv (T, D) += a^T (T, T) @ dout_h (T, D)
      Gemm(true, false, t, d, t, T(1), a, t, dout_h, q_width, T(1), dv, row);
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
      // dq (T, D) += scale * ds (T, T) @ k (T, D)
      Gemm(false, false, t, d, t, scale, da, t, k, row, T(1), dq, row);
      // dk (T, D) += scale * ds^T (T, T) @ q (T, D)
      Gemm(true, false, t, d, t, scale, da, t, q, row, T(1), dk, row);
    }
  }
}

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int b, int t, int c, int nh) {
  GqaAttentionForward(out, att, qkv, b, t, nh, nh, c / nh);
}

template <typename T>
void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int b, int t,
                       int c, int nh) {
  GqaAttentionBackward(dqkv, scratch, dout, qkv, att, b, t, nh, nh, c / nh);
}

template void AttentionForward<float>(float*, float*, const float*, int, int, int, int);
template void AttentionForward<double>(double*, double*, const double*, int, int, int, int);
template void AttentionBackward<float>(float*, float*, const float*, const float*, const float*,
                                       int, int, int, int);
template void AttentionBackward<double>(double*, double*, const double*, const double*,
                                        const double*, int, int, int, int);
template void GqaAttentionForward<float>(float*, float*, const float*, int, int, int, int, int);
template void GqaAttentionForward<double>(double*, double*, const double*, int, int, int, int, int);
template void GqaAttentionBackward<float>(float*, float*, const float*, const float*, const float*,
                                          int, int, int, int, int);
template void GqaAttentionBackward<double>(double*, double*, const double*, const double*,
                                           const double*, int, int, int, int, int);

}  // namespace weft::engine::cpu
