// Causal self-attention core (the QKV and output projections are matmuls), multi-head and
// grouped-query: for each (b, query head h): att = softmax(mask(q_h @ k_g^T / sqrt(D))),
// out_h = att @ v_g, with g = h / (NH / NKV) the key/value head the query head shares.
// qkv rows are [q (NH * D) | k (NKV * D) | v (NKV * D)], head j owning channels
// [j*D, (j+1)*D) of its part; GPT-2 is NKV = NH, D = C / NH (rows [q | k | v], each C wide).
//
// Documents: with doc_starts (B, T) (packed sequences), query t of row b sees only keys
// [doc_starts[b, t], t], its own document's: attention is block-diagonal causal, each
// document computed as a sequence of its own (the GEMMs below run per document block, so the
// work shrinks with the documents). nullptr is one document a row: plain causal attention.
// doc_starts must segment each row: doc_starts[b, 0] = 0 and doc_starts[b, t] is t (a
// document starts) or doc_starts[b, t - 1].
//
// Sliding window (Mistral): with window > 0, query t also sees only the `window` keys ending
// at itself, j in (t - window, t]; it applies inside each document (by index, which within a
// document is the same distance). The GEMMs still run over each document's whole square.
//
// Contract: the forward keeps the (B, NH, T, T) softmax `att` (zeros outside the blocks) for
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
#include <cstdint>

#include "worker/engine/cpu/blas.h"
#include "worker/engine/cpu/model_core.h"
#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {
namespace {

// The documents of row `bi`: calls fn(start, length) for each, in order.
template <typename Fn>
void ForEachDocument(const int32_t* doc_starts, int bi, int t, Fn fn) {
  if (doc_starts == nullptr) {
    fn(0, t);
    return;
  }
  const int32_t* row = doc_starts + static_cast<size_t>(bi) * t;  // (T)
  int start = 0;
  for (int ti = 1; ti <= t; ++ti) {
    if (ti == t || row[ti] == ti) {
      fn(start, ti - start);
      start = ti;
    }
  }
}

// The first key query `ti` sees in its document: window > 0 keeps the last `window`.
int WindowStart(int window, int ti) { return window > 0 && ti >= window ? ti - window + 1 : 0; }

}  // namespace

template <typename T>
void GqaAttentionForward(T* out, T* att, const T* qkv, const int32_t* doc_starts, int window, int b,
                         int t, int nh, int nkv, int d) {
  const int row = (nh + 2 * nkv) * d;  // QKV
  const int q_width = nh * d;
  const int kv_width = nkv * d;
  const int group = nh / nkv;
  const T scale = T(1) / std::sqrt(T(d));
  for (int bi = 0; bi < b; ++bi) {
    for (int h = 0; h < nh; ++h) {
      const T* seq = qkv + static_cast<size_t>(bi) * t * row;
      T* a_all = att + (static_cast<size_t>(bi) * nh + h) * t * t;  // (T, T)
      if (doc_starts != nullptr) Zero(a_all, static_cast<size_t>(t) * t);
      ForEachDocument(doc_starts, bi, t, [&](int s0, int len) {
        const T* q = seq + static_cast<size_t>(s0) * row + h * d;  // (len, D)
        const T* k = seq + static_cast<size_t>(s0) * row + q_width + (h / group) * d;
        const T* v = k + kv_width;                        // (len, D)
        T* a = a_all + static_cast<size_t>(s0) * t + s0;  // (len, len), row stride T
        T* o = out + (static_cast<size_t>(bi) * t + s0) * q_width + h * d;  // stride NH * D
        // a (len, len) = scale * q (len, D) @ k^T (D, len); the upper triangle is overwritten.
        Gemm(false, true, len, len, d, scale, q, row, k, row, T(0), a, t);
        for (int ti = 0; ti < len; ++ti) {
          T* a_row = a + static_cast<size_t>(ti) * t;  // (len)
          const int lo = WindowStart(window, ti);
          T max_val = a_row[lo];
          for (int j = lo + 1; j <= ti; ++j) max_val = a_row[j] > max_val ? a_row[j] : max_val;
          T sum = 0;
          for (int j = lo; j <= ti; ++j) {
            a_row[j] = std::exp(a_row[j] - max_val);
            sum += a_row[j];
          }
          const T inv_sum = T(1) / sum;
          for (int j = lo; j <= ti; ++j) a_row[j] *= inv_sum;
          // Exact zeros outside the window make `a @ v` below causal without a masked GEMM.
          for (int j = 0; j < lo; ++j) a_row[j] = 0;
          for (int j = ti + 1; j < len; ++j) a_row[j] = 0;
        }
        // o (len, D) = a (len, len) @ v (len, D)
        Gemm(false, false, len, d, len, T(1), a, t, v, row, T(0), o, q_width);
      });
    }
  }
}

template <typename T>
void GqaAttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                          const int32_t* doc_starts, int window, int b, int t, int nh, int nkv,
                          int d) {
  const int row = (nh + 2 * nkv) * d;  // QKV
  const int q_width = nh * d;
  const int kv_width = nkv * d;
  const int group = nh / nkv;
  const T scale = T(1) / std::sqrt(T(d));
  for (int bi = 0; bi < b; ++bi) {
    for (int h = 0; h < nh; ++h) {
      ForEachDocument(doc_starts, bi, t, [&](int s0, int len) {
        const size_t seq = (static_cast<size_t>(bi) * t + s0) * row;
        const size_t q_off = seq + h * d;
        const size_t k_off = seq + q_width + (h / group) * d;
        const T* q = qkv + q_off;   // (len, D)
        const T* k = qkv + k_off;   // (len, D)
        const T* v = k + kv_width;  // (len, D)
        T* dq = dqkv + q_off;       // (len, D)
        T* dk = dqkv + k_off;       // (len, D)
        T* dv = dk + kv_width;      // (len, D)
        const T* a = att + (static_cast<size_t>(bi) * nh + h) * t * t +
                     static_cast<size_t>(s0) * t + s0;  // (len, len), row stride T
        const T* dout_h = dout + (static_cast<size_t>(bi) * t + s0) * q_width + h * d;
        T* da = scratch;  // (len, len), row stride len
        // da (len, len) = dout_h (len, D) @ v^T (D, len)
        Gemm(false, true, len, len, d, T(1), dout_h, q_width, v, row, T(0), da, len);
        // dv (len, D) += a^T (len, len) @ dout_h (len, D)
        Gemm(true, false, len, d, len, T(1), a, t, dout_h, q_width, T(1), dv, row);
        // Softmax backward in place: ds[j] = a[j] * (da[j] - sum_k a[k] da[k]) on the causal
        // part, 0 above the diagonal (masked scores have no gradient).
        for (int ti = 0; ti < len; ++ti) {
          const T* a_row = a + static_cast<size_t>(ti) * t;  // (len)
          T* d_row = da + static_cast<size_t>(ti) * len;     // (len)
          const int lo = WindowStart(window, ti);
          T dot = 0;
          for (int j = lo; j <= ti; ++j) dot += a_row[j] * d_row[j];
          for (int j = lo; j <= ti; ++j) d_row[j] = a_row[j] * (d_row[j] - dot);
          for (int j = 0; j < lo; ++j) d_row[j] = 0;
          for (int j = ti + 1; j < len; ++j) d_row[j] = 0;
        }
        // Scores were scale * q @ k^T:
        // dq (len, D) += scale * ds (len, len) @ k (len, D)
        Gemm(false, false, len, d, len, scale, da, len, k, row, T(1), dq, row);
        // dk (len, D) += scale * ds^T (len, len) @ q (len, D)
        Gemm(true, false, len, d, len, scale, da, len, q, row, T(1), dk, row);
      });
    }
  }
}

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, const int32_t* doc_starts, int b, int t, int c,
                      int nh) {
  GqaAttentionForward(out, att, qkv, doc_starts, /*window=*/0, b, t, nh, nh, c / nh);
}

template <typename T>
void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                       const int32_t* doc_starts, int b, int t, int c, int nh) {
  GqaAttentionBackward(dqkv, scratch, dout, qkv, att, doc_starts, /*window=*/0, b, t, nh, nh,
                       c / nh);
}

template void AttentionForward<float>(float*, float*, const float*, const int32_t*, int, int, int,
                                      int);
template void AttentionForward<double>(double*, double*, const double*, const int32_t*, int, int,
                                       int, int);
template void AttentionBackward<float>(float*, float*, const float*, const float*, const float*,
                                       const int32_t*, int, int, int, int);
template void AttentionBackward<double>(double*, double*, const double*, const double*,
                                        const double*, const int32_t*, int, int, int, int);
template void GqaAttentionForward<float>(float*, float*, const float*, const int32_t*, int, int,
                                         int, int, int, int);
template void GqaAttentionForward<double>(double*, double*, const double*, const int32_t*, int, int,
                                          int, int, int, int);
template void GqaAttentionBackward<float>(float*, float*, const float*, const float*, const float*,
                                          const int32_t*, int, int, int, int, int, int);
template void GqaAttentionBackward<double>(double*, double*, const double*, const double*,
                                           const double*, const int32_t*, int, int, int, int, int,
                                           int);

}  // namespace weft::engine::cpu
