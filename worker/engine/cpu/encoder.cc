// Encoder: out[b, t, :] = wte[token[b, t], :] + wpe[pos[b, t], :] (pos[b, t] = t, or the position
// in its document for packed sequences that restart positions), or wte[token[b, t], :] alone for a
// model without position embeddings (wpe == nullptr: Llama, whose positions are rotary).
//
// Contract: the backward ACCUMULATES (+=) into dwte and dwpe; it reads no parameter values,
// only the tokens. Rows of wte that no token selects (padding rows included) get nothing.
// Tokens must be in [0, V): the data layer validates them, so here they are not checked.
#include <cstddef>
#include <cstdint>

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                    const int32_t* positions, int b, int t, int c) {
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      T* out_bt = out + (static_cast<size_t>(bi) * t + ti) * c;               // (C)
      const T* wte_row = wte + static_cast<size_t>(tokens[bi * t + ti]) * c;  // (C)
      if (wpe == nullptr) {
        for (int i = 0; i < c; ++i) out_bt[i] = wte_row[i];
        continue;
      }
      const int pos = positions == nullptr ? ti : positions[bi * t + ti];
      const T* wpe_row = wpe + static_cast<size_t>(pos) * c;  // (C)
      for (int i = 0; i < c; ++i) out_bt[i] = wte_row[i] + wpe_row[i];
    }
  }
}

template <typename T>
void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                     const int32_t* positions, int b, int t, int c) {
  // Serial in (b, t) order: a token repeated in the batch adds into the same wte row, and a
  // fixed order keeps the sum bit-identical run to run.
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      const T* dout_bt = dout + (static_cast<size_t>(bi) * t + ti) * c;   // (C)
      T* dwte_row = dwte + static_cast<size_t>(tokens[bi * t + ti]) * c;  // (C)
      if (dwpe == nullptr) {
        for (int i = 0; i < c; ++i) dwte_row[i] += dout_bt[i];
        continue;
      }
      const int pos = positions == nullptr ? ti : positions[bi * t + ti];
      T* dwpe_row = dwpe + static_cast<size_t>(pos) * c;  // (C)
      for (int i = 0; i < c; ++i) {
        dwte_row[i] += dout_bt[i];
        dwpe_row[i] += dout_bt[i];
      }
    }
  }
}

template void EncoderForward<float>(float*, const int32_t*, const float*, const float*,
                                    const int32_t*, int, int, int);
template void EncoderForward<double>(double*, const int32_t*, const double*, const double*,
                                     const int32_t*, int, int, int);
template void EncoderBackward<float>(float*, float*, const float*, const int32_t*, const int32_t*,
                                     int, int, int);
template void EncoderBackward<double>(double*, double*, const double*, const int32_t*,
                                      const int32_t*, int, int, int);

}  // namespace weft::engine::cpu
