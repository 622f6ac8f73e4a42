#include "worker/model_io/checkpoint_schema.h"

#include "absl/strings/str_cat.h"

namespace weft::model_io {

const char* UnitStateName(UnitState state) {
  switch (state) {
    case UnitState::kParams:
      return "params";
    case UnitState::kM:
      return "m";
    case UnitState::kV:
      return "v";
  }
  return "?";
}

std::string CheckpointTensorName(int unit, UnitState state) {
  return absl::StrCat("u", unit, ".", UnitStateName(state));
}

HostFloats& UnitSlice::data(UnitState state) {
  return state == UnitState::kParams ? params : state == UnitState::kM ? m : v;
}

const HostFloats& UnitSlice::data(UnitState state) const {
  return state == UnitState::kParams ? params : state == UnitState::kM ? m : v;
}

}  // namespace weft::model_io
