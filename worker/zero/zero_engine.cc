#include "worker/zero/zero_engine.h"

#include <utility>

#include "common/status.h"

namespace weft::zero {

std::vector<size_t> UnitSizes(const engine::ModelArch& arch) {
  std::vector<size_t> sizes;
  for (int u = 0; u < arch.NumUnits(); ++u) sizes.push_back(arch.UnitSize(u));
  return sizes;
}

InitialUnit InitialUnitState(const engine::ModelArch& arch, const ShardLayout& layout, int stage,
                             uint64_t seed, int u) {
  const UnitShard& unit = layout.unit(u);
  const ShardRange range = layout.KeptRange(u, stage);
  const size_t kept = layout.KeptElements(u, stage);
  InitialUnit init;
  // The kept part starts at element range.begin of the unit (or is all padding); what lies
  // past the unit's end is padding and stays 0.
  init.decay_mask.assign(kept, 0);
  if (range.size() > 0) {
    arch.UnitDecayMaskRange(u, range.begin, range.end, init.decay_mask.data());
  }
  if (stage == 1 || stage == 2) {
    init.full.assign(unit.padded, 0.0f);
    arch.InitUnit(u, seed, init.full.data());
    const size_t begin = static_cast<size_t>(layout.rank()) * unit.shard;
    init.kept.assign(init.full.begin() + begin, init.full.begin() + begin + kept);
    return init;
  }
  init.kept.assign(kept, 0.0f);
  if (range.size() > 0) arch.InitUnitRange(u, seed, range.begin, range.end, init.kept.data());
  return init;
}

ZeroEngine::ZeroEngine(const weft::v1::JobSpec& spec,
                       std::unique_ptr<const engine::ModelArch> arch, int world, int rank)
    : spec_(spec),
      arch_(std::move(arch)),
      stage_(spec.zero_stage()),
      layout_(UnitSizes(*arch_), world, rank) {}

InitialUnit ZeroEngine::InitialState(int u) const {
  return InitialUnitState(*arch_, layout_, stage_, spec_.training().seed(), u);
}

absl::Status ZeroEngine::Snapshot(std::vector<model_io::UnitSlice>* into) const {
  into->resize(layout_.num_units());
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitShard& unit = layout_.unit(u);
    model_io::UnitSlice& slice = (*into)[u];
    slice.unit = u;
    slice.size = static_cast<int64_t>(unit.size);
    // A checkpoint takes each rank's shard range whatever the stage, so that the world's
    // slices tile every unit exactly once.
    slice.begin = unit.owned.begin;
    slice.end = unit.owned.end;
    const size_t offset = static_cast<size_t>(slice.begin - layout_.KeptRange(u, stage_).begin);
    const size_t n = static_cast<size_t>(slice.end - slice.begin);
    for (model_io::UnitState state : model_io::kUnitStates) {
      model_io::HostFloats& data = slice.data(state);
      // Same size as the previous snapshot's: no reallocation, no zero fill.
      data.resize(n);
      if (n > 0) WEFT_RETURN_IF_ERROR(CopyKeptToHost(u, state, offset, n, data.data()));
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::Restore(const model_io::RangeReader& read, int64_t optimizer_steps) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const ShardRange range = layout_.KeptRange(u, stage_);
    std::vector<float> kept(layout_.KeptElements(u, stage_));
    for (model_io::UnitState state : model_io::kUnitStates) {
      std::fill(kept.begin(), kept.end(), 0.0f);
      if (range.size() > 0) {
        WEFT_RETURN_IF_ERROR(
            read(model_io::CheckpointTensorName(u, state), range.begin, range.end, kept.data()));
      }
      WEFT_RETURN_IF_ERROR(CopyKeptFromHost(u, state, kept.data()));
    }
  }
  WEFT_RETURN_IF_ERROR(FinishRestore(read));
  optimizer_steps_ = optimizer_steps;
  return absl::OkStatus();
}

}  // namespace weft::zero
