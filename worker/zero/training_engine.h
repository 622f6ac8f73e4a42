// What a generation run needs of a training engine, whatever the device: the CPU ZeroCpuEngine
// (worker/zero/zero_cpu.h, Gloo) and the GPU ZeroCudaEngine (worker/zero/zero_cuda.h, NCCL)
// implement it. Both shard units the same way and name checkpoint tensors the same way, so a
// checkpoint written by one is read by the other, at any world size.
#ifndef WEFT_WORKER_ZERO_TRAINING_ENGINE_H_
#define WEFT_WORKER_ZERO_TRAINING_ENGINE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model_io/checkpoint_schema.h"
#include "worker/engine/model_arch.h"
#include "worker/zero/shard_layout.h"

namespace weft::zero {

struct StepTimings {
  double step_ms = 0;
  double forward_ms = 0;
  double backward_ms = 0;
  // Time compute waited for collectives (communication not hidden behind compute).
  double exposed_comm_ms = 0;
  double optimizer_ms = 0;
};

// What a step's FP8 casts did to their values on one rank (engine/cuda/fp8.h's
// Fp8CastCounts): values cast, of them those that underflowed to zero and those saturated.
struct Fp8Tally {
  int64_t values = 0;
  int64_t underflows = 0;
  int64_t saturated = 0;
};

struct StepResult {
  // Mean training loss over the targets of the global batch of the step that count (0 when
  // none does).
  float loss = 0;
  // Those targets, over the global batch.
  int64_t targets = 0;
  // Global gradient norm before clipping. Not finite (NaN or infinity): the step was skipped,
  // parameters and optimizer state are as they were before it (engine::GradScaleFor).
  float grad_norm = 0;
  double learning_rate = 0;
  StepTimings timings;
  // With precision FP8 (zeros otherwise), this rank's casts since the step before: E4M3 the
  // Linear layers' inputs and weights, E5M2 their output gradients. A validation pass in
  // between counts with the next step.
  Fp8Tally fp8_e4m3;
  Fp8Tally fp8_e5m2;
};

// One rank's micro-batch: engine-owned buffers, each (B, T) int32, that a BatchFn fills.
struct MicroBatch {
  int32_t* inputs = nullptr;
  // A negative target is IGNORED (Hugging Face's labels = -100): it is no target. A step's
  // loss is the mean cross-entropy over the targets that are not ignored in the whole global
  // batch (every rank, every micro-step), and its gradient that mean's; with none at all the
  // loss is 0 and the gradient 0 (docs/data.md, "Training on documents").
  int32_t* targets = nullptr;
  // Packed documents: doc_starts[b, t] is the position in row b where t's document begins (t
  // itself, or doc_starts[b, t - 1]); attention never crosses a document. Non-null exactly when
  // the job's data.document_masking is on, and then the BatchFn must fill it.
  int32_t* doc_starts = nullptr;
};

// Fills micro-batch `micro_step` of optimizer step `step` for this rank.
using BatchFn = std::function<void(int64_t step, int micro_step, const MicroBatch& batch)>;

// A step's (or an evaluation's) loss from what the ranks summed. Each of `micro_batches`
// micro-batches (over all ranks) of `positions` positions gave the model's loss: its ignored
// targets' losses 0, summed and divided by all positions (engine/cpu/model.h). `loss_sum` is
// the sum of those, `targets` how many targets counted in all.
struct MaskedMean {
  float loss = 0;  // mean over the targets that count; 0 when none does
  int64_t targets = 0;
  // What turns the gradient of the mean over all positions (what the backward computed) into
  // that of the mean over the targets that count: micro_batches * positions / targets, exactly
  // 1 when every target counts, 0 when none does (the gradient is then 0, not NaN).
  float gradient_scale = 1;
};
inline MaskedMean MaskedMeanOf(double loss_sum, double targets, int64_t micro_batches,
                               size_t positions) {
  MaskedMean m;
  const double all = static_cast<double>(micro_batches) * static_cast<double>(positions);
  m.targets = static_cast<int64_t>(targets + 0.5);
  if (m.targets <= 0) {
    m.gradient_scale = 0;
    return m;
  }
  m.loss = static_cast<float>(loss_sum * static_cast<double>(positions) /
                              static_cast<double>(m.targets));
  if (static_cast<double>(m.targets) != all) {
    m.gradient_scale = static_cast<float>(all / static_cast<double>(m.targets));
  } else {
    // Every target counts: the mean of the micro-step means, as before masks existed.
    m.loss = static_cast<float>(loss_sum / static_cast<double>(micro_batches));
  }
  return m;
}

// The targets of `batch` (B * T of them) that are not ignored.
inline int64_t CountedTargets(const MicroBatch& batch, size_t positions) {
  int64_t n = 0;
  for (size_t i = 0; i < positions; ++i) n += batch.targets[i] >= 0 ? 1 : 0;
  return n;
}

class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;

  // One optimizer step (grad_accum_steps micro-steps). `step` is 0-based and picks the
  // learning rate and the batches. A failed collective returns its status (ABORTED after the
  // communicator was aborted); the model state is then unspecified.
  virtual absl::StatusOr<StepResult> TrainStep(int64_t step, const BatchFn& batch) = 0;
  // Mean loss over the targets that count of `batches` micro-batches per rank (forward only),
  // over all ranks; 0 when none counts.
  virtual absl::StatusOr<float> EvalLoss(int batches, const BatchFn& batch) = 0;
  // Unit `u`'s full fp32 parameters (unpadded). Collective: all ranks must call it, for the
  // same unit. How the final model is written a unit at a time, so that no rank ever holds
  // more of the model than one unit.
  virtual absl::StatusOr<std::vector<float>> GatherUnit(int u) = 0;
  // Every unit's full fp32 parameters (unpadded): the whole model in memory, for callers that
  // want it so (tests, small models). Collective.
  absl::StatusOr<std::vector<std::vector<float>>> GatherParameters() {
    std::vector<std::vector<float>> units;
    for (int u = 0; u < arch().NumUnits(); ++u) {
      absl::StatusOr<std::vector<float>> unit = GatherUnit(u);
      if (!unit.ok()) return unit.status();
      units.push_back(std::move(*unit));
    }
    return units;
  }
  // A host copy of this rank's checkpoint slices (params, AdamW m and v) into `into`. Local: no
  // communication, so training can go on while the copy is uploaded. Fails only when the
  // device copy does (a GPU fault); `into` is then partly written. Buffers `into` already
  // holds are filled in place when they have the sizes of this rank's slices (a previous
  // snapshot's): a save after the first allocates and page-faults nothing, which at billions
  // of parameters is most of what a fresh copy costs.
  virtual absl::Status Snapshot(std::vector<model_io::UnitSlice>* into) const = 0;
  // The same into fresh buffers.
  absl::StatusOr<std::vector<model_io::UnitSlice>> Snapshot() const {
    std::vector<model_io::UnitSlice> slices;
    if (absl::Status s = Snapshot(&slices); !s.ok()) return s;
    return slices;
  }
  // Loads the state this rank owns from a checkpoint written at any world size, whose state
  // had had `optimizer_steps` AdamW updates (CheckpointManifest.optimizer_step). Local; on
  // error the model state is unspecified (restore another checkpoint or start over).
  virtual absl::Status Restore(const model_io::RangeReader& read, int64_t optimizer_steps) = 0;
  // Bytes of parameters + gradients + optimizer state kept between steps.
  virtual size_t StateBytes() const = 0;
  // Bytes of transient working buffers and activations.
  virtual size_t WorkingBytes() const = 0;

  // GPU engines: device bytes the engine allocated, and the device's bytes in use overall
  // (context and NCCL included). 0 on CPU.
  virtual size_t EngineDeviceBytes() const { return 0; }
  virtual size_t DeviceUsedBytes() const { return 0; }
  // How the engine laid out its memory and why (the activation checkpointing level it runs
  // at), for the job's events; empty when there is nothing to say.
  virtual std::string MemoryPlanNote() const { return ""; }

  // AdamW updates applied so far: the steps taken less those skipped (a gradient that was not
  // finite), plus those of the checkpoint restored. The bias corrections count these, not the
  // step index, as PyTorch's AdamW counts its own steps; a checkpoint carries the count.
  virtual int64_t optimizer_steps() const = 0;

  // The model's architecture: units, tensors, sizes.
  virtual const engine::ModelArch& arch() const = 0;
  virtual int stage() const = 0;
  // Ranks [0, n) of the world write checkpoints (0: all): their Snapshots tile the state once.
  // With hybrid sharding's replicated state, one group's ranks.
  virtual int checkpoint_writers() const { return 0; }
};

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_TRAINING_ENGINE_H_
