// The ZeRO scheme, written once for every device: which part of each unit a rank keeps
// (ShardLayout), how a unit starts (each element a pure function of (seed, unit, index), so a
// rank initialises only what it keeps and any world size starts from the same model), and the
// checkpoint
// protocol (Snapshot and Restore by global range, so any world size and either device reads
// any checkpoint).
//
// A device engine (ZeroCpuEngine over Gloo, ZeroCudaEngine over NCCL) derives from it, runs the
// steps, and lends two copy primitives over the state it keeps: CopyKeptToHost and
// CopyKeptFromHost. "Kept" is ShardLayout::KeptElements of a unit: the whole padded unit at
// stage 0, the rank's shard at stages 1-3; element 0 of what is kept is element
// KeptRange(u).begin of the unit. When the replicas share the optimizer out (sharding
// replica_optimizer OPTIMIZER_SHARDED) the AdamW moments (m, v) are kept of the rank's piece of
// its shard only (UnitShard::piece, from piece_offset).
#ifndef WEFT_WORKER_ZERO_ZERO_ENGINE_H_
#define WEFT_WORKER_ZERO_ZERO_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model_io/checkpoint_schema.h"
#include "worker/engine/model_arch.h"
#include "worker/zero/shard_layout.h"
#include "worker/zero/training_engine.h"
#include "weft/v1/job.pb.h"

namespace weft::zero {

// Every unit's size in elements, in unit order: what a ShardLayout is made of.
std::vector<size_t> UnitSizes(const engine::ModelArch& arch);

// Unit `u` as a rank of `layout` starts it at ZeRO `stage` from `seed`: the kept part of its
// initial values and of its AdamW decay mask (zeros where the kept part is padding), each
// element initialised from (seed, unit, index) alone, so the values never depend on the world.
// Only the kept part is ever built, except at stages 1-2, which keep the whole unit resident by
// design (their price for gathering nothing per step): `full` is then the whole padded unit.
// At stage 3 no rank holds more than its shard of any unit.
struct InitialUnit {
  std::vector<float> full;          // (padded) at stages 1-2; empty at stages 0 and 3
  std::vector<float> kept;          // (KeptElements)
  std::vector<uint8_t> decay_mask;  // (KeptElements)
};
InitialUnit InitialUnitState(const engine::ModelArch& arch, const ShardLayout& layout, int stage,
                             uint64_t seed, int u);

class ZeroEngine : public TrainingEngine {
 public:
  // Local (no communication): copies this rank's slice of every unit through CopyKeptToHost,
  // into `into`'s buffers where they have the right sizes. The slice is the rank's shard, or
  // with the optimizer shared out over the replicas its piece of it (UnitShard::owned_piece):
  // the slices of the ranks that write (checkpoint_writers) tile every unit exactly once.
  absl::Status Snapshot(std::vector<model_io::UnitSlice>* into) const final;
  using TrainingEngine::Snapshot;
  // Local: reads the kept range of every unit's params, m and v (any writer's world size),
  // hands each to CopyKeptFromHost (zeros where the kept part is padding), then lets the
  // device finish (FinishRestore). On error the model state is unspecified.
  absl::Status Restore(const model_io::RangeReader& read, int64_t optimizer_steps) final;

  const engine::ModelArch& arch() const final { return *arch_; }
  int stage() const final { return stage_; }
  int64_t optimizer_steps() const final { return optimizer_steps_; }
  const ShardLayout& layout() const { return layout_; }
  // The group's ranks (the layout's world), or every rank when each keeps a piece of its own.
  int checkpoint_writers() const final { return shards_moments_ ? 0 : layout_.world(); }

 protected:
  // `arch` is MakeModelArch(spec.model()); `pieces`: ReplicaPieces; `shards_moments`:
  // ShardsOptimizer (m and v kept of the rank's piece only).
  ZeroEngine(const weft::v1::JobSpec& spec, std::unique_ptr<const engine::ModelArch> arch,
             int world, int rank, ShardPieces pieces = {}, bool shards_moments = false);

  // What this rank keeps of unit u's `state`: the layout's KeptRange, or for m and v of a
  // sharded optimizer the piece; and how many elements (padding included).
  ShardRange KeptStateRange(int u, model_io::UnitState state) const;
  size_t KeptStateElements(int u, model_io::UnitState state) const;

  // Unit `u` as this rank starts it (InitialUnitState from the job's seed).
  InitialUnit InitialState(int u) const;

  // Copies `n` elements of the kept `state` of unit `u`, from element `offset` of the kept
  // part, to `host`. Called between steps only.
  virtual absl::Status CopyKeptToHost(int u, model_io::UnitState state, size_t offset, size_t n,
                                      float* host) const = 0;
  // Replaces the whole kept `state` of unit `u` (KeptStateElements floats at `host`).
  virtual absl::Status CopyKeptFromHost(int u, model_io::UnitState state, const float* host) = 0;
  // After every unit's params, m and v were replaced: clear the gradients and rebuild what
  // derives from the parameters (resident copies, low-precision copies). `read` reads the
  // same checkpoint again.
  virtual absl::Status FinishRestore(const model_io::RangeReader& read) = 0;

  const weft::v1::JobSpec spec_;
  const std::unique_ptr<const engine::ModelArch> arch_;
  const int stage_;
  const ShardLayout layout_;
  const bool shards_moments_;
  // TrainingEngine::optimizer_steps: a step's AdamW runs with optimizer_steps_ + 1, and the
  // count advances when the step's gradient norm came out finite (the update was applied).
  int64_t optimizer_steps_ = 0;
};

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_ZERO_ENGINE_H_
