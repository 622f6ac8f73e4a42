// ZeRO data parallelism on the CPU (fp32, Gloo), stages 0-3: the CPU device of ZeroEngine
// (worker/zero/zero_engine.h), which holds the sharding (ShardLayout: units padded to a multiple of
// the world, rank r owns shard r), initialisation and the checkpoint protocol.
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
// Hybrid sharding (worker/zero/sharding_groups.h): `comm` is the rank's group, the engine shards
// over it, and a `replica` communicator joins the ranks at the same position in every group.
// After the micro-steps of a step, each unit's gradient shard is all-reduced over the replica
// (once per step, not per micro-step: the sums are the same and the bytes a grad_accum-th), so
// every replica holds the gradient of the whole world; the gradient norm sums the squares over
// the group only (the replicas' shards are equal), and losses sum over group then replica.
// With sharding.replica_reduce_format bf16 or int8 that all-reduce is comm/wire_codec.h's
// WireAllReduce, unit by unit; fp32 is Gloo's, every unit's enqueued at once.
// With replica_optimizer OPTIMIZER_SHARDED (ShardLayout's pieces, one per replica) the
// all-reduce is a reduce-scatter instead (fp32: Gloo's; bf16 or int8: WireReduceScatter, the
// all-reduce's first half, so each piece ends with the all-reduce's bits); each replica keeps
// m and v of its piece and steps it, and an fp32 all-gather over the replica brings the other
// pieces' new weights. The norm is summed piece by piece in both modes (then over the group),
// so the two give the same bits.
//
// Numerics: the loss of one optimizer step is the mean over world * grad_accum micro-batches;
// each backward is scaled by 1 / (world * grad_accum) so that the reduce-scattered (summed)
// gradient is the gradient of that mean. Initialisation depends on (seed, unit) only, so any
// world size starts from the same model.
#ifndef WEFT_WORKER_ZERO_ZERO_CPU_H_
#define WEFT_WORKER_ZERO_ZERO_CPU_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/wire_format.h"
#include "worker/zero/memory_plan.h"
#include "worker/zero/training_engine.h"
#include "worker/zero/zero_engine.h"
#include "worker/engine/checkpointing.h"
#include "worker/engine/cpu/model.h"
#include "weft/v1/job.pb.h"

namespace weft::zero {

// What one rank of `spec` needs in host memory at `level`, `micro_batch_size` rows, ZeRO
// `stage`, with each unit sharded over `group` ranks (the engine's communicator), from the
// sizes ZeroCpuEngine and its CpuModel allocate by (the activations counted by the model's own
// buffer list: `model`, the CpuModelEntry of `arch`). `writes_checkpoints`: the rank keeps the
// checkpointer's host copy (a rank that writes, of a job with checkpoint.interval_steps > 0).
CpuMemoryPlan PlanCpuMemory(const weft::v1::JobSpec& spec, const engine::ModelArch& arch,
                            const engine::cpu::CpuModelEntry& model, engine::Checkpointing level,
                            int micro_batch_size, int group, int stage, bool writes_checkpoints,
                            ShardPieces pieces = {}, bool shards_moments = false);

struct ZeroCpuOptions {
  // The job's ranks on this host (JoinResponse.local_world_size), which share its memory.
  int ranks_on_host = 1;
  // What the host can give, in bytes; unset: /proc/meminfo's MemAvailable
  // (HostAvailableBytes). Tests set it to try a budget without needing a host that small.
  std::optional<size_t> host_available_bytes;
};

class ZeroCpuEngine : public ZeroEngine {
 public:
  // The model of `spec` sharded over `comm` (not owned; must outlive the engine), with
  // activations for micro-batches of spec.training (micro_batch_size, sequence_length) at
  // spec.training.activation_checkpointing (AUTO: the least recomputation that fits), which
  // changes memory and time only: the losses and gradients are the same bits at every level.
  // Initialises parameters from spec.training.seed. INVALID_ARGUMENT for a stage outside 0-3.
  // `replica` (not owned; may be null: one replica) makes it hybrid: the world is
  // comm->world_size() * replica->world_size().
  //
  // Before allocating anything, the memory plan (PlanCpuMemory, decided by DecideCpuMemory
  // against this rank's share of options.host_available_bytes) must fit: RESOURCE_EXHAUSTED
  // naming every part of the need, the budget and what would fit otherwise. Collective over
  // `comm` and `replica` (every rank must call it): every rank's verdict is summed before any
  // rank allocates, so the host's ranks all read MemAvailable before any of them takes memory,
  // and one rank that cannot run fails every rank at once (RESOURCE_EXHAUSTED) instead of
  // leaving them to allocate and hang in their first collective. A failed collective returns
  // its error.
  static absl::StatusOr<std::unique_ptr<ZeroCpuEngine>> Create(
      const weft::v1::JobSpec& spec, comm::Communicator* comm,
      comm::Communicator* replica = nullptr, const ZeroCpuOptions& options = {});
  // Whether a rank of `spec` in a group of `group_size` ranks, with `replicas` replicas, would
  // fit its share of this host's memory now: OK, or Create's RESOURCE_EXHAUSTED (or its
  // INVALID_ARGUMENT for the stage or architecture). Local: no collective.
  static absl::Status CheckFits(const weft::v1::JobSpec& spec, int group_size, int replicas,
                                const ZeroCpuOptions& options = {});

  // One optimizer step (grad_accum_steps micro-steps). `step` is 0-based and picks the
  // learning rate and the batches. A failed collective returns its status (ABORTED after the
  // communicator was aborted); the model state is then unspecified.
  absl::StatusOr<StepResult> TrainStep(int64_t step, const BatchFn& batch) override;

  // Mean loss over `batches` micro-batches per rank (forward only), averaged over ranks.
  absl::StatusOr<float> EvalLoss(int batches, const BatchFn& batch) override;

  // Unit `u`'s full parameters (unpadded). Collective: all ranks must call it.
  absl::StatusOr<std::vector<float>> GatherUnit(int u) override;

  // Bytes of parameters + gradients + optimizer state this rank keeps between steps (working
  // buffers of stage 3 excluded; see WorkingBytes).
  size_t StateBytes() const override;
  // Bytes of the transient full-unit buffers (stage 3 gathers) and activations.
  size_t WorkingBytes() const override;

  // The level Create chose and the plan that fitted, for the job's events (MEMORY_PLANNED).
  std::string MemoryPlanNote() const override { return plan_note_; }
  const CpuMemoryPlan& memory_plan() const { return plan_; }

 private:
  struct Unit {
    // Kept state (ShardLayout::KeptElements): stage 0 the whole padded unit, else the shard;
    // m and v of the rank's piece of it with a sharded optimizer (KeptStateElements).
    std::vector<float> params, grads, m, v;
    std::vector<uint8_t> decay_mask;
    // Stages 1-2: the resident full parameters; stage 0 uses `params` (full) directly.
    std::vector<float> resident;
    // Stages 0-2: the full gradient a backward accumulates into.
    std::vector<float> full_grad;
  };

  ZeroCpuEngine(const weft::v1::JobSpec& spec, comm::Communicator* comm,
                comm::Communicator* replica, std::unique_ptr<const engine::ModelArch> arch,
                std::unique_ptr<engine::cpu::CpuModel> model, ShardPieces pieces,
                bool shards_moments);
  void Initialize();

  // The kept params, m or v of unit `u`.
  std::vector<float>& Kept(int u, model_io::UnitState state);
  const std::vector<float>& Kept(int u, model_io::UnitState state) const;
  absl::Status CopyKeptToHost(int u, model_io::UnitState state, size_t offset, size_t n,
                              float* host) const override;
  absl::Status CopyKeptFromHost(int u, model_io::UnitState state, const float* host) override;
  absl::Status FinishRestore(const model_io::RangeReader& read) override;

  // Full parameters of `unit` for compute (stages 0-2: resident).
  const float* ResidentParams(int unit) const;
  float* FullGrad(int unit);

  // Waits on `work`, charging the wait to exposed communication.
  absl::Status Await(const std::shared_ptr<comm::Work>& work);
  std::shared_ptr<comm::Work> GatherInto(int unit, float* dst);

  // The micro-batch buffers a BatchFn fills.
  MicroBatch Buffers();
  // Hands the model the documents of `mb` (none without document masking).
  void SetDocuments(const MicroBatch& mb);
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
  // Hybrid: sums every unit's kept gradient over the replica (no-op with one replica); with
  // the optimizer's pieces, only the rank's piece of each is summed (a reduce-scatter).
  absl::Status AllReduceOverReplica();
  absl::Status ReduceScatterOverReplica();
  // comm/wire_codec.h's WireAllReduce or WireReduceScatter of every unit's kept gradient over
  // the replica, in replica_format_ (not fp32).
  using WireCollective = absl::Status (*)(comm::Communicator&, comm::WireFormat, float*, size_t,
                                          std::vector<uint8_t>*, std::vector<uint8_t>*);
  absl::Status WireOverReplica(WireCollective collective);
  // Pieces: every unit's stepped piece all-gathered over the replica, in place.
  absl::Status GatherPiecesOverReplica();
  // The squares of every kept gradient summed piece by piece (only the rank's own piece with
  // the optimizer's pieces, their sums then gathered over the replica), in one fixed order.
  absl::StatusOr<double> SumOfSquaresByPiece();
  // Sums `n` floats at `values` over the whole world: the group, then the replica.
  absl::Status SumOverWorld(float* values, size_t n);

  comm::Communicator* comm_;     // the group (the world without hybrid sharding)
  comm::Communicator* replica_;  // null: one replica
  const int world_;              // every rank of every replica
  // sharding.replica_reduce_format (fp32 without replicas) and WireAllReduce's scratch.
  const comm::WireFormat replica_format_;
  std::vector<uint8_t> wire_send_, wire_recv_;
  const int batch_size_;
  const int seq_len_;
  std::vector<Unit> units_;
  const std::unique_ptr<engine::cpu::CpuModel> model_;
  CpuMemoryPlan plan_;
  std::string plan_note_;

  // Stage 3 working buffers: two for blocks (current and prefetched), one for the head.
  std::vector<float> block_work_[2];
  std::vector<float> head_work_;
  std::vector<float> block_grad_work_[2];
  std::vector<float> head_grad_work_;
  std::vector<float> scatter_out_[2];
  std::vector<float> head_scatter_out_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<int32_t> doc_starts_;  // (B, T) with data.document_masking; empty otherwise

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

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_ZERO_CPU_H_
