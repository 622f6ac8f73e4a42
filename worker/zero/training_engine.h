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

struct StepResult {
  // Mean training loss over the global batch of the step.
  float loss = 0;
  // Global gradient norm before clipping. Not finite (NaN or infinity): the step was skipped,
  // parameters and optimizer state are as they were before it (engine::GradScaleFor).
  float grad_norm = 0;
  double learning_rate = 0;
  StepTimings timings;
};

// Fills micro-batch `micro_step` of optimizer step `step` for this rank: inputs and targets,
// each (B, T) int32.
using BatchFn =
    std::function<void(int64_t step, int micro_step, int32_t* inputs, int32_t* targets)>;

class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;

  // One optimizer step (grad_accum_steps micro-steps). `step` is 0-based and picks the
  // learning rate and the batches. A failed collective returns its status (ABORTED after the
  // communicator was aborted); the model state is then unspecified.
  virtual absl::StatusOr<StepResult> TrainStep(int64_t step, const BatchFn& batch) = 0;
  // Mean loss over `batches` micro-batches per rank (forward only), averaged over ranks.
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
