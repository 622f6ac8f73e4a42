// A checkpoint read out of an engine's snapshot, as checkpointd would serve it by global range
// (a world-1 snapshot's slices are whole tensors), for the tests that restore one engine from
// another without a checkpointd (zero_cuda_test, checkpointer_test).
#ifndef WEFT_TESTS_WORKER_SNAPSHOT_READER_H_
#define WEFT_TESTS_WORKER_SNAPSHOT_READER_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model_io/checkpoint_schema.h"
#include "worker/zero/training_engine.h"

namespace weft::testing {

// Reads the ranges the slices cover; NOT_FOUND for a tensor they do not hold. The slices must
// outlive the reader.
inline model_io::RangeReader ReaderOf(const std::vector<model_io::UnitSlice>& slices) {
  return [&slices](const std::string& tensor, int64_t begin, int64_t end,
                   float* out) -> absl::Status {
    for (const model_io::UnitSlice& s : slices) {
      for (model_io::UnitState what : model_io::kUnitStates) {
        if (tensor != model_io::CheckpointTensorName(s.unit, what)) continue;
        const model_io::HostFloats& src = s.data(what);
        std::copy(src.begin() + (begin - s.begin), src.begin() + (end - s.begin), out);
        return absl::OkStatus();
      }
    }
    return absl::NotFoundError(tensor);
  };
}

}  // namespace weft::testing

#endif  // WEFT_TESTS_WORKER_SNAPSHOT_READER_H_
