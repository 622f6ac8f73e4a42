// Packed documents, as both engines take them (engine/cpu/model.h's SetDocuments,
// engine/cuda/model.h's SetBatch): doc_starts (B, T) is where each position's document begins.
#ifndef WEFT_WORKER_ENGINE_DOCUMENTS_H_
#define WEFT_WORKER_ENGINE_DOCUMENTS_H_

#include <cstddef>
#include <cstdint>

namespace weft::engine {

// positions[b, t] = t - doc_starts[b, t], the position within its document. Returns -1 when
// doc_starts segments every row (each entry is t itself or the previous entry), else the flat
// index of the first entry that does not: the data layer builds them, and a bad one would let
// attention read outside its row, so the engines refuse it rather than trust it.
inline int64_t DocumentPositions(const int32_t* doc_starts, int b, int t, int32_t* positions) {
  for (int bi = 0; bi < b; ++bi) {
    const size_t row = static_cast<size_t>(bi) * t;
    for (int ti = 0; ti < t; ++ti) {
      const int32_t start = doc_starts[row + ti];
      if (start != ti && (ti == 0 || start != doc_starts[row + ti - 1])) {
        return static_cast<int64_t>(row + ti);
      }
      positions[row + ti] = ti - start;
    }
  }
  return -1;
}

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_DOCUMENTS_H_
