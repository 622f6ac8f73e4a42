#include "worker/zero_engine.h"

#include <utility>

#include "common/status.h"

namespace weft::worker {

std::vector<size_t> UnitSizes(const engine::ModelArch& arch) {
  std::vector<size_t> sizes;
  for (int u = 0; u < arch.NumUnits(); ++u) sizes.push_back(arch.UnitSize(u));
  return sizes;
}

ZeroEngine::ZeroEngine(const weft::v1::JobSpec& spec,
                       std::unique_ptr<const engine::ModelArch> arch, int world, int rank)
    : spec_(spec),
      arch_(std::move(arch)),
      stage_(spec.zero_stage()),
      layout_(UnitSizes(*arch_), world, rank) {}

ZeroEngine::InitialUnit ZeroEngine::InitialState(int u) const {
  const UnitShard& unit = layout_.unit(u);
  InitialUnit init;
  // Every rank initialises the whole unit and keeps its part: the model is the same for any
  // world size, at the cost of initialising (once) what other ranks own.
  init.full.assign(unit.padded, 0.0f);
  std::vector<uint8_t> mask(unit.padded, 0);
  arch_->InitUnit(u, spec_.training().seed(), init.full.data());
  arch_->UnitDecayMask(u, mask.data());
  const size_t kept = layout_.KeptElements(u, stage_);
  const size_t begin = stage_ == 0 ? 0 : static_cast<size_t>(layout_.rank()) * unit.shard;
  init.kept.assign(init.full.begin() + begin, init.full.begin() + begin + kept);
  init.decay_mask.assign(mask.begin() + begin, mask.begin() + begin + kept);
  return init;
}

absl::StatusOr<std::vector<UnitSlice>> ZeroEngine::Snapshot() const {
  std::vector<UnitSlice> slices;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitShard& unit = layout_.unit(u);
    UnitSlice slice;
    slice.unit = u;
    slice.size = static_cast<int64_t>(unit.size);
    // A checkpoint takes each rank's shard range whatever the stage, so that the world's
    // slices tile every unit exactly once.
    slice.begin = unit.owned.begin;
    slice.end = unit.owned.end;
    const size_t offset = static_cast<size_t>(slice.begin - layout_.KeptRange(u, stage_).begin);
    const size_t n = static_cast<size_t>(slice.end - slice.begin);
    for (UnitState state : kUnitStates) {
      std::vector<float>& data = slice.data(state);
      data.resize(n);
      if (n > 0) WEFT_RETURN_IF_ERROR(CopyKeptToHost(u, state, offset, n, data.data()));
    }
    slices.push_back(std::move(slice));
  }
  return slices;
}

absl::Status ZeroEngine::Restore(const RangeReader& read) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const ShardRange range = layout_.KeptRange(u, stage_);
    std::vector<float> kept(layout_.KeptElements(u, stage_));
    for (UnitState state : kUnitStates) {
      std::fill(kept.begin(), kept.end(), 0.0f);
      if (range.size() > 0) {
        WEFT_RETURN_IF_ERROR(
            read(CheckpointTensorName(u, state), range.begin, range.end, kept.data()));
      }
      WEFT_RETURN_IF_ERROR(CopyKeptFromHost(u, state, kept.data()));
    }
  }
  return FinishRestore(read);
}

}  // namespace weft::worker
