// Rotary position embeddings (Llama), Hugging Face's convention: within each head of q and k,
// element i and element i + D/2 (i < D/2) form a pair rotated by the angle pos * inv_freq[i]:
//   y[i]       = x[i] cos - x[i + D/2] sin
//   y[i + D/2] = x[i + D/2] cos + x[i] sin
// (q * cos + rotate_half(q) * sin with rotate_half(x) = [-x2, x1]; the same roundings).
//
// Contract: the forward rotates q and k IN PLACE in the (B, T, QKV) buffer, so attention and
// its backward read the rotated values without another copy. The rotation is linear and needs
// no saved input: the backward applies the transposed rotation (angle -pos * inv_freq) to dq
// and dk IN PLACE (=, the one non-accumulating backward of ops.h). v is never touched.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {
namespace {

// Rotates every head in x (T, heads * D) by +angle (sign 1) or -angle (sign -1) per position.
template <typename T>
void RotateHeads(T* x, int row_stride, const T* cos, const T* sin, const int32_t* positions, int t,
                 int heads, int d, T sign) {
  const int half = d / 2;
  for (int ti = 0; ti < t; ++ti) {
    const int pos = positions == nullptr ? ti : positions[ti];
    const T* c = cos + static_cast<size_t>(pos) * half;  // (D/2)
    const T* s = sin + static_cast<size_t>(pos) * half;  // (D/2)
    T* row = x + static_cast<size_t>(ti) * row_stride;
    for (int h = 0; h < heads; ++h) {
      T* x1 = row + h * d;  // (D/2)
      T* x2 = x1 + half;    // (D/2)
      for (int i = 0; i < half; ++i) {
        const T a = x1[i];
        const T b = x2[i];
        const T si = sign * s[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = b * c[i] + a * si;
      }
    }
  }
}

template <typename T>
void RotateQk(T* qkv, const T* cos, const T* sin, const int32_t* positions, int b, int t, int nh,
              int nkv, int d, T sign) {
  const int row = (nh + 2 * nkv) * d;  // QKV
  for (int bi = 0; bi < b; ++bi) {
    T* seq = qkv + static_cast<size_t>(bi) * t * row;
    const int32_t* pos = positions == nullptr ? nullptr : positions + static_cast<size_t>(bi) * t;
    RotateHeads(seq, row, cos, sin, pos, t, nh, d, sign);            // q
    RotateHeads(seq + nh * d, row, cos, sin, pos, t, nkv, d, sign);  // k
  }
}

}  // namespace

template <typename T>
void RopeTables(T* cos, T* sin, const double* inv_freq, int t, int d) {
  const int half = d / 2;
  for (int ti = 0; ti < t; ++ti) {
    for (int i = 0; i < half; ++i) {
      const double angle = ti * inv_freq[i];
      cos[static_cast<size_t>(ti) * half + i] = static_cast<T>(std::cos(angle));
      sin[static_cast<size_t>(ti) * half + i] = static_cast<T>(std::sin(angle));
    }
  }
}

template <typename T>
void RopeForward(T* qkv, const T* cos, const T* sin, const int32_t* positions, int b, int t, int nh,
                 int nkv, int d) {
  RotateQk(qkv, cos, sin, positions, b, t, nh, nkv, d, T(1));
}

template <typename T>
void RopeBackward(T* dqkv, const T* cos, const T* sin, const int32_t* positions, int b, int t,
                  int nh, int nkv, int d) {
  RotateQk(dqkv, cos, sin, positions, b, t, nh, nkv, d, T(-1));
}

template void RopeTables<float>(float*, float*, const double*, int, int);
template void RopeTables<double>(double*, double*, const double*, int, int);
template void RopeForward<float>(float*, const float*, const float*, const int32_t*, int, int, int,
                                 int, int);
template void RopeForward<double>(double*, const double*, const double*, const int32_t*, int, int,
                                  int, int, int);
template void RopeBackward<float>(float*, const float*, const float*, const int32_t*, int, int, int,
                                  int, int);
template void RopeBackward<double>(double*, const double*, const double*, const int32_t*, int, int,
                                   int, int, int);

}  // namespace weft::engine::cpu
