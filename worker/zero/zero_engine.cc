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
                       std::unique_ptr<const engine::ModelArch> arch, int world, int rank,
                       ShardPieces pieces, bool shards_moments)
    : spec_(spec),
      arch_(std::move(arch)),
      stage_(spec.zero_stage()),
      layout_(UnitSizes(*arch_), world, rank, pieces),
      shards_moments_(shards_moments) {}

ShardRange ZeroEngine::KeptStateRange(int u, model_io::UnitState state) const {
  if (state == model_io::UnitState::kParams || !shards_moments_) {
    return layout_.KeptRange(u, stage_);
  }
  return layout_.unit(u).owned_piece;
}

size_t ZeroEngine::KeptStateElements(int u, model_io::UnitState state) const {
  if (state == model_io::UnitState::kParams || !shards_moments_) {
    return layout_.KeptElements(u, stage_);
  }
  return layout_.unit(u).piece;
}

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
    // A checkpoint takes each rank's shard range whatever the stage (its piece of it when the
    // replicas share the optimizer out), so that the writers' slices tile every unit once.
    const ShardRange& range = shards_moments_ ? unit.owned_piece : unit.owned;
    slice.begin = range.begin;
    slice.end = range.end;
    const size_t n = static_cast<size_t>(slice.end - slice.begin);
    for (model_io::UnitState state : model_io::kUnitStates) {
      const size_t offset = static_cast<size_t>(slice.begin - KeptStateRange(u, state).begin);
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
    std::vector<float> kept;
    for (model_io::UnitState state : model_io::kUnitStates) {
      const ShardRange range = KeptStateRange(u, state);
      kept.assign(KeptStateElements(u, state), 0.0f);
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
