// ZeRO data parallelism over the unit-wise GPT engine.
//
// Parameters live in units (engine/gpt.h): the head (embeddings + final LayerNorm) and one per
// transformer block, each a flat buffer. Every unit is split into `world` equal shards (the
// unit padded with zeros to a multiple of `world`); rank r owns shard r.
//
//   stage 0   every rank holds everything; gradients are all-reduced; full AdamW everywhere.
//   stage 1-2 parameters stay resident in full; gradients are reduce-scattered unit by unit as
//             soon as a unit's backward ends; AdamW touches the local shard; the updated
//             shards are all-gathered back into the resident copy.
//   stage 3   only shards are resident. Before a unit's forward (and again before its
//             backward) its parameters are all-gathered into a working buffer; the next unit's
//             all-gather is issued before this one computes, so it overlaps; after a block's
//             backward its gradient is reduce-scattered while the previous block computes.
//
// The communicator runs collectives in issue order on its own thread; waiting on a Work is
// the only synchronisation, and the time spent waiting is the "exposed communication".
// All ranks issue the same collectives in the same order.
//
// Numerics: the loss of one optimizer step is the mean over world * grad_accum micro-batches;
// each backward is scaled by 1 / (world * grad_accum) so that the reduce-scattered (summed)
// gradient is the gradient of that mean. Initialisation depends on (seed, unit) only, so any
// world size starts from the same model.
#ifndef WEFT_WORKER_ZERO_CPU_H_
#define WEFT_WORKER_ZERO_CPU_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/training_engine.h"
#include "worker/engine/gpt.h"
#include "weft/v1/job.pb.h"

namespace weft::worker {

class ZeroCpuEngine : public TrainingEngine {
 public:
  // The model of `spec` sharded over `comm` (not owned; must outlive the engine), with
  // activations for micro-batches of spec.training (micro_batch_size, sequence_length).
  // Initialises parameters from spec.training.seed. INVALID_ARGUMENT for a stage outside 0-3.
  static absl::StatusOr<std::unique_ptr<ZeroCpuEngine>> Create(const weft::v1::JobSpec& spec,
                                                           comm::Communicator* comm);

  // One optimizer step (grad_accum_steps micro-steps). `step` is 0-based and picks the
  // learning rate and the batches. A failed collective returns its status (ABORTED after the
  // communicator was aborted); the model state is then unspecified.
  absl::StatusOr<StepResult> TrainStep(int64_t step, const BatchFn& batch) override;

  // Mean loss over `batches` micro-batches per rank (forward only), averaged over ranks.
  absl::StatusOr<float> EvalLoss(int batches, const BatchFn& batch) override;

  // Every unit's full parameters (unpadded). Collective: all ranks must call it.
  absl::StatusOr<std::vector<std::vector<float>>> GatherParameters() override;

  // A host copy of this rank's checkpoint slices (params, AdamW m and v). Local: no
  // communication, so training can go on while the copy is uploaded.
  std::vector<UnitSlice> Snapshot() const override;
  // Loads the state this rank owns from a checkpoint written at any world size. Local; on
  // error the model state is unspecified (restore another checkpoint or start over).
  absl::Status Restore(const RangeReader& read) override;

  // Bytes of parameters + gradients + optimizer state this rank keeps between steps (working
  // buffers of stage 3 excluded; see WorkingBytes).
  size_t StateBytes() const override;
  // Bytes of the transient full-unit buffers (stage 3 gathers) and activations.
  size_t WorkingBytes() const override;

  const engine::GptConfig& config() const override { return config_; }
  int stage() const override { return stage_; }

 private:
  struct Unit {
    size_t size = 0;    // floats in the unit
    size_t padded = 0;  // size rounded up to a multiple of world
    size_t shard = 0;   // padded / world
    // Owned state. Stage 0: full (padded) sizes; stages 1-3: shard sizes.
    std::vector<float> params, grads, m, v;
    std::vector<uint8_t> decay_mask;
    // Stages 1-2: the resident full parameters; stage 0 uses `params` (full) directly.
    std::vector<float> resident;
    // Stages 0-2: the full gradient a backward accumulates into.
    std::vector<float> full_grad;
  };

  ZeroCpuEngine(const weft::v1::JobSpec& spec, comm::Communicator* comm);
  void Initialize();

  // Full parameters of `unit` for compute (stages 0-2: resident).
  const float* ResidentParams(int unit) const;
  float* FullGrad(int unit);

  // Waits on `work`, charging the wait to exposed communication.
  absl::Status Await(const std::shared_ptr<comm::Work>& work);
  std::shared_ptr<comm::Work> GatherInto(int unit, float* dst);

  // Forward (and backward when `targets` are for training) of one micro-batch. Returns the
  // micro-batch mean loss on this rank. Gradients end in Unit::grads (shards) for stages 1-3,
  // in Unit::full_grad for stage 0.
  absl::StatusOr<float> MicroStep(const int32_t* inputs, const int32_t* targets, bool backward,
                                  float loss_scale);
  absl::StatusOr<float> MicroStepStage3(const int32_t* inputs, const int32_t* targets,
                                        bool backward, float loss_scale);
  absl::StatusOr<float> MicroStepResident(const int32_t* inputs, const int32_t* targets,
                                          bool backward, float loss_scale);
  // Reduce-scatters `full` (padded) and adds the result into the unit's gradient shard.
  absl::Status ReduceScatterAccumulate(int unit, float* full);

  const weft::v1::JobSpec spec_;
  comm::Communicator* comm_;
  const engine::GptConfig config_;
  const int stage_;
  const int world_;
  const int rank_;
  const int batch_size_;
  const int seq_len_;
  std::vector<Unit> units_;
  engine::GptCpu model_;

  // Stage 3 working buffers: two for blocks (current and prefetched), one for the head.
  std::vector<float> block_work_[2];
  std::vector<float> head_work_;
  std::vector<float> block_grad_work_[2];
  std::vector<float> head_grad_work_;
  std::vector<float> scatter_out_[2];
  std::vector<float> head_scatter_out_;
  std::vector<int32_t> inputs_, targets_;

  // Compute time of a phase: wall time minus the exposed communication inside it.
  class PhaseTimer {
   public:
    PhaseTimer(ZeroCpuEngine* engine, double* total)
        : engine_(engine), total_(total), start_(std::chrono::steady_clock::now()),
          exposed_at_start_(engine->exposed_ms_) {}
    ~PhaseTimer() { Stop(); }
    void Stop() {
      if (total_ == nullptr) return;
      const double wall = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - start_).count();
      *total_ += wall - (engine_->exposed_ms_ - exposed_at_start_);
      total_ = nullptr;
    }

   private:
    ZeroCpuEngine* engine_;
    double* total_;
    std::chrono::steady_clock::time_point start_;
    double exposed_at_start_;
  };

  // Accumulate during a step.
  double exposed_ms_ = 0;
  double forward_ms_ = 0;
  double backward_ms_ = 0;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_ZERO_CPU_H_
