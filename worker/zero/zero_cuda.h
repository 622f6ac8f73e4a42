// ZeRO-3 data parallelism on GPUs: the CUDA device of ZeroEngine (worker/zero/zero_engine.h), over
// NCCL; the twin of ZeroCpuEngine (worker/zero/zero_cpu.h).
//
// Units and shards come from the same ShardLayout as the CPU engine's, so checkpoints move
// freely between the two engines and world sizes.
// Each rank keeps, for its shards only: fp32 master parameters, AdamW m and v and the fp32
// gradient: 16 bytes a parameter. Weight decay is kept as runs of each shard (a unit's
// tensors alternate between decayed matrices and undecayed norms), not as a per-element mask.
// What an all-gather sends is cast to bf16 from the master as the gather starts, in place in
// the destination. At world 1 the model's backward accumulates straight into the shard's
// gradient (the shard is the unit): no full-unit gradient buffers, no reduce-scatter.
// With optimizer offload the master, m, v and a decay mask of the offloaded units (all of them,
// or with optimizer.offload_fraction the last ones: memory_plan.h's FirstOffloadedUnit) live in
// pinned host memory and step on the host; the device keeps their gradient and a bf16 copy of
// the shard. The other units keep everything on the GPU and step there.
// The optimizer — both AdamWs, the offload's staging, the update in the next forward — is
// ZeroCudaOptimizer (worker/zero/cuda_optimizer.h): the engine keeps the per-unit state both
// read (CudaShard) and the stream schedule, and calls it once the clip scale is known, from
// its gathers, and before anything reads or replaces the state between steps.
//
// Two streams, ordered by CUDA events only — the host never waits inside a step:
//   compute: the model's kernels and GEMMs (and the optimizer, when it runs at the end of
//            the step: offload, or ZeroCudaOptions::update_in_next_forward off);
//   comm:    the communicator's stream (NCCL all-gathers, reduce-scatters, the step's
//            all-reduce), plus the gradient accumulation of micro-steps after the first and
//            the last step's AdamW update, unit by unit before each forward gather. With one
//            rank and one replica, compute has the higher priority.
// Forward: block l+1's bf16 parameters are all-gathered into the other of two working
// buffers while block l computes. Backward: the last block's parameters are still in place;
// block l-1 is gathered while block l computes its backward, and block l's gradient is
// reduce-scattered (fp32) while block l-1 computes. A tied head (embeddings, final LayerNorm,
// tied LM head) stays gathered for the whole micro-step; its gradient is reduce-scattered
// after the encoder backward. An untied one (ModelArch::HeadOutputBegin) is two pieces that
// take turns in one buffer: the LM head's gradient is reduced right after the classifier, the
// embedding's after the encoder backward. Under a plan that recomputes the last block, the
// head's fp32 gradient also takes turns with the block slots' (one buffer, not two).
// The host synchronises once per step (after the optimizer), through
// CudaCommunicator::WaitEvent, so an abort or a dead peer ends the wait.
//
// Hybrid sharding (worker/zero/sharding_groups.h): `comm` is the rank's group, the engine shards
// over it, and a `replica` communicator (its own stream) joins the ranks at the same position in
// every group. On the last micro-step, right behind each unit's reduce-scatter (and
// accumulation) on the comm stream, the replica stream waits for it, all-reduces the shard's
// gradient over the replicas (in sharding.replica_reduce_format: fp32 through NCCL, bf16 or
// int8 as comm/wire_codec.h composes them, with engine/cuda/wire_codec.h's kernels) and adds
// its sum of squares: the cross-group traffic overlaps
// the backward of the units below, and the group's gathers never queue behind it. Compute
// waits for the replica stream before the optimizer. Without replicas the code path is the
// full-sharding one, unchanged.
// With replica_optimizer OPTIMIZER_SHARDED the shards are cut into one piece per replica
// (ShardLayout's pieces, whole wire blocks): that all-reduce is a reduce-scatter instead
// (NCCL's in place, or the compressed one's first half), the rank keeps m and v of its piece
// and steps it on compute at the end of the step (no update in the next forward), and the
// replica stream then all-gathers every unit's stepped piece in place, in forward order, each
// recording `pieces_gathered_[u]`, which the unit's next gather (comm) waits for: the fp32
// gather across the groups overlaps the next forward.
//
// Exposed communication is measured on the GPU: timing events around every point where the
// compute stream waits for the comm stream; their sum is the time compute stood still.
#ifndef WEFT_WORKER_ZERO_ZERO_CUDA_H_
#define WEFT_WORKER_ZERO_ZERO_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/wire_format.h"
#include "worker/engine/adamw.h"
#include "worker/engine/cuda/model.h"
#include "worker/engine/model_arch.h"
#include "worker/zero/cuda_optimizer.h"
#include "worker/zero/gpu_memory_plan.h"
#include "worker/zero/memory_plan.h"
#include "worker/zero/training_engine.h"
#include "worker/zero/zero_engine.h"
#include "weft/v1/job.pb.h"

namespace weft::zero {

// The GPU's ActivationBytesFn (gpu_memory_plan.h): the allocation of `model` (the CUDA model
// of an architecture, engine::cuda::FindCudaModel) at `sequence_length`.
ActivationBytesFn CudaActivationBytes(engine::cuda::CudaModelEntry model, int sequence_length);

// What a rank of `spec` needs on its GPU at this checkpointing plan, micro-batch rows and world
// size, with the units the spec offloads (none with offload_auto, which Create decides): the
// totals of PlanGpuBuffers (gpu_memory_plan.h) at CudaActivationBytes, which also plans other
// offloads (first_offloaded). INVALID_ARGUMENT for an architecture without a CUDA model.
absl::StatusOr<GpuMemoryPlan> PlanGpuMemory(const weft::v1::JobSpec& spec,
                                            const engine::ModelArch& arch,
                                            const engine::CheckpointingPlan& level,
                                            int micro_batch_size, int world_size,
                                            const ZeroCudaOptions& options = {});

// OK for a GPU of compute capability major.minor that the CUDA engine's kernels run on (bf16
// tensor cores: 8.0, Ampere, or newer; precision FP8's GEMMs: 8.9, Ada and Hopper, or newer);
// FAILED_PRECONDITION saying so otherwise.
absl::Status CheckComputeCapability(int major, int minor,
                                    weft::v1::Precision precision = weft::v1::BF16);

class ZeroCudaEngine : public ZeroEngine {
 public:
  // The model of `spec` on the communicator's device (current device must be it), sharded
  // over `comm` (not owned). Checks the memory plan against the device's free memory first:
  // RESOURCE_EXHAUSTED with the numbers when it does not fit. FAILED_PRECONDITION for a stage
  // other than 3 (the only one this engine implements). `replica` (not owned; may be null: one
  // replica) makes it hybrid: the world is comm->world_size() * replica->world_size().
  // `ranks_on_host`: the job's ranks on this host, whose optimizer offloads share its memory.
  // Collective: every rank of the world calls it, and when any rank cannot build its engine
  // (its memory), all of them return an error, the others saying that another rank could not.
  static absl::StatusOr<std::unique_ptr<ZeroCudaEngine>> Create(
      const weft::v1::JobSpec& spec, comm::CudaCommunicator* comm,
      comm::CudaCommunicator* replica = nullptr, int ranks_on_host = 1,
      const ZeroCudaOptions& options = {});
  ~ZeroCudaEngine() override;
  // Whether a rank of `spec` in a group of `group_size` ranks, with `replicas` replicas, would
  // fit this device now (the current device): OK, or Create's refusal (RESOURCE_EXHAUSTED with
  // the numbers; FAILED_PRECONDITION for the stage or device). Local: no collective.
  static absl::Status CheckFits(const weft::v1::JobSpec& spec, int group_size, int replicas,
                                int ranks_on_host);

  absl::StatusOr<StepResult> TrainStep(int64_t step, const BatchFn& batch) override;
  absl::StatusOr<float> EvalLoss(int batches, const BatchFn& batch) override;
  absl::StatusOr<std::vector<float>> GatherUnit(int u) override;
  size_t StateBytes() const override { return plan_.totals.state_bytes; }
  size_t WorkingBytes() const override {
    return plan_.totals.working_bytes + plan_.totals.activation_bytes;
  }

  // Everything the engine allocates is allocated at creation, so this is also its peak.
  size_t EngineDeviceBytes() const override {
    return allocated_bytes_ + model_->ActivationBytes() + model_->BlasWorkspaceBytes();
  }
  size_t DeviceUsedBytes() const override;
  std::string MemoryPlanNote() const override { return plan_note_; }

 private:
  using bf16 = __nv_bfloat16;
  // This rank's shard of one unit, shared with the optimizer (cuda_optimizer.h).
  using Unit = CudaShard;

  ZeroCudaEngine(const weft::v1::JobSpec& spec, comm::CudaCommunicator* comm,
                 comm::CudaCommunicator* replica, std::unique_ptr<const engine::ModelArch> arch,
                 int first_offloaded, const ZeroCudaOptions& options);
  absl::Status Initialize();
  absl::Status CopyKeptToHost(int u, model_io::UnitState state, size_t offset, size_t n,
                              float* host) const override;
  absl::Status CopyKeptFromHost(int u, model_io::UnitState state, const float* host) override;
  absl::Status FinishRestore(const model_io::RangeReader& read) override;
  float* Kept(int u, model_io::UnitState state) const;
  // Initialize's parts: the streams and ordering events; every buffer of plan_ (Carve) bound
  // to its member (Bind); each unit's initial state; the optimizer over units_ and this
  // engine's streams.
  absl::Status CreateStreams();
  absl::Status AllocatePlanned();
  absl::StatusOr<void*> Carve(const GpuBuffer& buffer);
  absl::Status Bind(const GpuBuffer& buffer, void* memory);
  absl::Status InitializeUnits();
  absl::Status CreateOptimizer();
  // Device memory (kDevice) or pinned host memory (kPinnedHost, cudaMallocHost) for
  // `buffer`, at least one element, freed with the engine.
  absl::StatusOr<void*> Allocate(const GpuBuffer& buffer);
  bool Offloaded(int u) const { return u >= first_offloaded_; }
  bool any_offloaded() const { return first_offloaded_ < layout_.num_units(); }

  // Comm waits for everything enqueued on the compute stream so far.
  absl::Status CommWaitsCompute();
  absl::Status Gather(int unit, bf16* dst);
  absl::Status ReduceScatterGrad(int unit, float* full, bool accumulate);
  // Elements [begin, end) of unit 0: the whole head, or one of its pieces (head_split_).
  struct HeadPiece {
    size_t begin = 0;
    size_t end = 0;
    size_t size() const { return end - begin; }
  };
  // On the comm stream: `piece` into head_work_ (element begin + i at i); an unsplit head is
  // gathered whole, padding included.
  absl::Status GatherHead(HeadPiece piece);
  // On the comm stream: head_grad_ (element begin + i at i) summed over the group into this
  // rank's shard gradient of `piece`, added to it when `accumulate`.
  absl::Status ReduceHeadGrad(HeadPiece piece, bool accumulate);
  // Compute waits for the block slots' pending reduce-scatters.
  absl::Status WaitForSlotScatters();
  // Zeroes the block slots' fp32 padding past the blocks' elements (on compute).
  absl::Status ZeroSlotPadding();
  // One micro-batch through the model; with `backward`, gradients reach the shards. The last
  // micro-step of a step also adds each shard's sum of squares into stats_[0] on the comm
  // stream as soon as that shard's gradient is final, behind the backward of the next units.
  absl::Status MicroStep(const MicroBatch& batch, bool backward, float grad_scale,
                         bool first_micro_step, bool last_micro_step);
  // The micro-batch buffers a BatchFn fills.
  MicroBatch Buffers();
  // This rank's targets that count, into stats_[2] (on the compute stream).
  absl::Status StageTargetCount(int64_t counted);
  // stats_ into host_stats_ (on the compute stream; read after a sync).
  absl::Status CopyStatsToHost();
  // MicroStep's parts, in its order; each enqueues on the streams and records the events it
  // names, and none waits on the host.
  // The head's pieces: the embedding's (input) and the final norm and LM head's (output); an
  // unsplit head is both.
  HeadPiece InputPiece() const;
  HeadPiece OutputPiece() const;
  // Whether the LM head's gradient is reduced right after the classifier: when it is a piece
  // of its own, or must make room for the blocks' (HeadGradTakesTurnsWithBlocks).
  bool ReducesClassifierGrad() const;
  // The encoder's and every block's forward, each block gathered one ahead of its compute
  // (the last step's pending update with the gathers, the units under the head first); ends
  // with the output piece gathered, compute waiting for it.
  absl::Status Forward();
  // The classifier and the loss sum into stats_[1]; with `backward`, the LM head's gradient
  // into the head's buffer (zeroed first unless it accumulates in place), reduced at once
  // when ReducesClassifierGrad.
  absl::Status ClassifierStep(bool backward, float grad_scale, bool first_micro_step);
  // Every block's recomputation and backward, last first: block l-1 gathered while block l
  // computes, block l's gradient reduce-scattered (beyond world 1) while l-1 computes.
  absl::Status BackwardBlocks(bool first_micro_step, bool last_micro_step);
  // The embedding's backward into the head's gradient (zeroed first where the LM head's
  // was reduced out of it).
  absl::Status EmbeddingBackward();
  // On comm: the embedding's (or an unsplit head's) gradient reduced into the shard; the
  // last micro-step then finishes unit 0's shard gradient (FinishShardGradient).
  absl::Status ReduceEmbeddingGrad(bool first_micro_step, bool last_micro_step);
  // TrainStep's parts. Zeroes stats_ and runs the step's micro-steps: gradients in the
  // shards, the loss sum and sum of squares in stats_.
  absl::Status AccumulateGradients(int64_t step, const BatchFn& batch);
  // Compute waits for every reduce-scatter, accumulation and replica all-reduce: what the
  // optimizer reads is final.
  absl::Status WaitForGradients();
  // The step's timings from its timing events (the host has waited for opt_end): forward
  // and backward less the compute waits inside them, the optimizer with the waits for
  // gathers behind its update; `wall_start`: when TrainStep began.
  StepTimings StepTimingsOf(size_t opt_begin, size_t opt_end,
                            std::chrono::steady_clock::time_point wall_start) const;
  // stats_[0] += the sum of squares of unit u's (final) shard gradient, on the comm stream.
  absl::Status SumSquaresOnComm(int unit);
  // Last micro-step, behind unit u's reduce-scatter (or backward): SumSquaresOnComm, or with
  // replicas the shard's all-reduce over them and its sum of squares, on the replica stream.
  absl::Status FinishShardGradient(int unit);
  // The replicas' sum of a shard's gradient (`shard` floats at grads) in replica_format_
  // (not fp32), in place, enqueued on the replica stream.
  absl::Status WireAllReduceOnReplica(float* grads, size_t shard);
  // The wire all-reduce's first half on the replica stream (not fp32): every replica's
  // chunks of `shard` floats at grads encoded and exchanged, and this rank's chunk summed,
  // encoded, at the returned place in wire_recv_.
  absl::StatusOr<uint8_t*> ReduceOwnWireChunk(const float* grads, size_t shard);
  // The replicas' sum of the rank's piece of a shard's gradient, in replica_format_, in place
  // (the rest of the shard is left as scratch), enqueued on the replica stream.
  absl::Status ReduceScatterOnReplica(float* grads, size_t shard);
  // Sharded optimizer, after the step's AdamW (on compute): every unit's piece all-gathered
  // over the replicas on the replica stream, recording pieces_gathered_.
  absl::Status GatherPiecesOnReplica();
  // Sharded optimizer: `stream` waits until unit u's pieces are back (a no-op otherwise).
  absl::Status WaitForPieces(int u, cudaStream_t stream);
  // Sharded optimizer: the host waits for the replica stream (before the state is read or
  // replaced between steps); a no-op otherwise.
  absl::Status SyncPieces() const;
  // stats_ ([sum of squares, loss sum]) summed over the group, the loss sum also over the
  // replicas (their shards are the same: squares counted once; with a sharded optimizer
  // each replica squared its own piece, and both are summed); then compute waits for it.
  absl::Status AllReduceStats();
  // Waits for the compute stream's work so far (host), through the communicator.
  absl::Status SyncCompute() const;

  comm::CudaCommunicator* comm_;     // the group (the world without hybrid sharding)
  comm::CudaCommunicator* replica_;  // null: one replica
  // world_: every rank of every replica; group_: the ranks the state is sharded over.
  const int world_, group_, batch_size_, seq_len_;
  // Every buffer the engine allocates (Initialize allocates exactly these), and the totals.
  GpuBufferPlan plan_;
  engine::CheckpointingPlan checkpointing_;
  std::string plan_note_;
  cudaStream_t compute_ = nullptr;
  std::unique_ptr<engine::cuda::CudaModel> model_;
  std::vector<Unit> units_;
  std::vector<void*> allocations_;
  size_t allocated_bytes_ = 0;

  bf16* head_work_ = nullptr;  // GpuBufferRole::kHeadWork, CudaModel::HeadWork
  bf16* block_work_[2] = {nullptr, nullptr};
  float* head_grad_ = nullptr;
  // Block l's fp32 gradient is block_grad_[l % 2], one buffer under two names with
  // ZeroCudaOptions::one_block_grad_slot (one_block_grad_slot_).
  float* block_grad_[2] = {nullptr, nullptr};
  bool one_block_grad_slot_ = false;
  // GatherUnit: world pieces of gather_chunk_ floats; with offload, a device copy of a piece.
  size_t gather_chunk_ = 0;
  float* gather_staging_ = nullptr;
  float* gather_source_ = nullptr;
  float* stats_ = nullptr;         // device [sum of squares, loss sum, targets that count]
  float* grad_scale_ = nullptr;    // device scalar
  float* norm_scratch_ = nullptr;
  float* host_stats_ = nullptr;  // pinned: gpu_memory_plan.h's kHostStats
  // The FP8 casts' tallies in host_stats_ (gpu_memory_plan.h's kHostStats): [E4M3, E5M2].
  engine::cuda::Fp8CastCounts* HostFp8Counts() const {
    return reinterpret_cast<engine::cuda::Fp8CastCounts*>(host_stats_ + 6);
  }
  // Optimizer offload of units [first_offloaded_, n) (n: none): their Unit::params, m, v and
  // host_decay_mask are pinned host memory, and so are the two staging pairs of the host
  // step (the plan's, handed to the optimizer).
  const int first_offloaded_;
  float* staging_grads_[2] = {nullptr, nullptr};
  uint16_t* staging_bf16_[2] = {nullptr, nullptr};
  const ZeroCudaOptions options_;
  const bool direct_grads_;  // world 1: the model writes the shard's gradient itself
  // ModelArch::HeadOutputBegin: the embedding's piece of unit 0 ends and the final norm and LM
  // head's starts here; 0 for a head that does not split. A split head's pieces take turns in
  // head_work_ and head_grad_, each as large as the larger piece.
  const size_t head_split_;
  // GpuBufferPlan::head_grad_takes_turns: head_grad_ and block_grad_ are one buffer, the
  // head's gradient first, the slots over it.
  bool head_grad_takes_turns_ = false;
  std::vector<void*> host_allocations_;
  // sharding.replica_reduce_format with replicas (fp32 without); its wire buffers
  // (GpuBufferRole::kWireSend, kWireRecv) where it is not fp32.
  const comm::WireFormat replica_format_;
  uint8_t* wire_send_ = nullptr;
  uint8_t* wire_recv_ = nullptr;
  // AdamW, its offload and its update in the next forward. Called from const methods too
  // (snapshots run the pending update first): that changes how the state is stored, not
  // what it is.
  std::unique_ptr<ZeroCudaOptimizer> optimizer_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<int32_t> doc_starts_;  // (B, T) with data.document_masking; empty otherwise

  // Ordering events (no timing). One compute->comm event serves every "comm waits for all
  // compute so far"; comm->compute waits are per buffer so compute never waits for more than
  // the transfer it needs.
  cudaEvent_t compute_ready_ = nullptr;
  cudaEvent_t head_gathered_ = nullptr, gathered_[2] = {nullptr, nullptr};
  cudaEvent_t head_scattered_ = nullptr, scattered_[2] = {nullptr, nullptr};
  cudaEvent_t comm_done_ = nullptr;
  // Hybrid only: the replica stream waits for the comm stream / compute for the replica's.
  cudaEvent_t replica_ready_ = nullptr, replica_done_ = nullptr;
  // Sharded optimizer only: each unit's stepped pieces gathered (GatherPiecesOnReplica), and
  // the end of the replica stream's work for the host.
  std::vector<cudaEvent_t> pieces_gathered_;
  cudaEvent_t replica_idle_ = nullptr;
  bool scatter_pending_[3] = {false, false, false};  // block slots 0, 1; head
  // Timing events, recycled every step: pairs around compute-stream waits (exposed
  // communication) and the phase marks.
  class TimingEvents {
   public:
    ~TimingEvents();
    absl::StatusOr<cudaEvent_t> Next();
    void Reset() { used_ = 0; }
    cudaEvent_t at(size_t i) const { return events_[i]; }
    size_t used() const { return used_; }

   private:
    std::vector<cudaEvent_t> events_;
    size_t used_ = 0;
  };
  TimingEvents timing_;
  // Indices into timing_; `behind_update`: the wait was for a gather behind an update.
  struct Wait {
    size_t begin, end;
    bool behind_update;
  };
  std::vector<Wait> waits_;
  std::vector<std::array<size_t, 3>> phases_;           // begin, forward end, backward end
  absl::StatusOr<size_t> Mark();                        // records a timing event on compute
  // Timed wait of compute on `event`.
  absl::Status ComputeWaits(cudaEvent_t event, bool behind_update = false);
  absl::Status CheckWork(const std::shared_ptr<comm::Work>& work);
};

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_ZERO_CUDA_H_
