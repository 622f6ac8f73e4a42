// What a ZeRO checkpoint holds, whatever the engine, stage or world size that wrote it: per
// model unit, three fp32 tensors over the unit's unpadded flat space — the parameters and
// AdamW's first and second moments — named "u<unit>.params", "u<unit>.m", "u<unit>.v".
// Each rank writes the slice of every tensor that its shard covers (ShardLayout), so a reader
// at any world size finds any range by name.
#ifndef WEFT_WORKER_MODEL_IO_CHECKPOINT_SCHEMA_H_
#define WEFT_WORKER_MODEL_IO_CHECKPOINT_SCHEMA_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model_io/host_buffer.h"

namespace weft::model_io {

enum class UnitState { kParams, kM, kV };
inline constexpr std::array<UnitState, 3> kUnitStates = {UnitState::kParams, UnitState::kM,
                                                         UnitState::kV};

// "params", "m", "v".
const char* UnitStateName(UnitState state);
// "u<unit>.<state>".
std::string CheckpointTensorName(int unit, UnitState state);

// What one rank saves of one unit: elements [begin, end) of the unit's unpadded flat space.
struct UnitSlice {
  int unit = 0;
  int64_t size = 0;  // elements in the whole unit
  int64_t begin = 0;
  int64_t end = 0;
  // end - begin elements each; in host memory a device engine may pin
  // (worker/model_io/host_buffer.h).
  HostFloats params, m, v;

  HostFloats& data(UnitState state);
  const HostFloats& data(UnitState state) const;
};

// Reads elements [begin, end) of the named checkpoint tensor into `out`.
using RangeReader = std::function<absl::Status(const std::string& tensor, int64_t begin,
                                               int64_t end, float* out)>;

}  // namespace weft::model_io

#endif  // WEFT_WORKER_MODEL_IO_CHECKPOINT_SCHEMA_H_
