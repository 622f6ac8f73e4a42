// The GPU engine's memory (worker/zero/zero_cuda.h), buffer by buffer, without CUDA: every
// device and pinned host buffer ZeroCudaEngine allocates, with its size, and the
// GpuMemoryPlan (memory_plan.h) totals summed from that list. The engine allocates exactly
// the list, so what the plan promises DecideMemory and what Initialize allocates cannot
// drift apart; and since nothing here needs a GPU, the arithmetic is tested on every machine.
//
// The one size it cannot know is the CUDA model's allocation (activations, scratch, GEMM
// workspace, and what the engine asks the model to hold): the caller passes it in
// (ActivationBytesFn; the GPU engine's is zero_cuda.h's CudaActivationBytes, from the CUDA model
// registry).
#ifndef WEFT_WORKER_ZERO_GPU_MEMORY_PLAN_H_
#define WEFT_WORKER_ZERO_GPU_MEMORY_PLAN_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/checkpointing.h"
#include "worker/engine/cuda/plan_sizes.h"
#include "worker/engine/model_arch.h"
#include "worker/zero/memory_plan.h"
#include "weft/v1/job.pb.h"

namespace weft::zero {

// How the engine lays out its memory; the defaults are what jobs run with, and a test may
// turn a saving off to compare against it.
struct ZeroCudaOptions {
  // Without gradient accumulation (training.grad_accum_steps 1) each block's shard gradient
  // lives over activations that are spent by the time it is written
  // (CudaModel::SpentActivationGradient) instead of in memory of its own: the gradients of the
  // last blocks over the first blocks' activations, as a caching allocator would reuse them.
  // It saves the smaller of the blocks' gradient shards and their activations, on every GPU.
  bool gradients_over_spent_activations = true;
  // Beyond world 1, when every block recomputes its forward (FULL), the blocks' full fp32
  // gradients take turns in one buffer instead of two: block l - 1's backward writes it once
  // block l's reduce-scatter has read it, which ran behind block l - 1's recomputation. It
  // saves up to a block's fp32 gradient on every GPU, less where the head's gradient takes
  // its turn in the same buffer and is the larger (0.75 GiB at GPT 6.7B, 2.5 at Llama-70B,
  // none at Llama-8B).
  bool one_block_grad_slot = true;
  // With the optimizer on the GPU (no offload), a step's AdamW update runs in the next forward
  // (the next TrainStep's or EvalLoss's), unit by unit on the comm stream just before the
  // unit's gather: it overlaps the forward's matmuls instead of adding its memory traffic to
  // the step, and writes the bf16 copy the gather sends (no separate cast). The units whose
  // gradients lie under the gathered head go first. What reads or replaces the state between
  // steps (Snapshot, GatherUnit, Restore) sees the step's result: pending updates run first.
  // 2.3% of an 8-layer GPT 6.7B step on an H100 (docs/performance.md); bit-identical results.
  bool update_in_next_forward = true;
  // Not a choice: the replicas each gradient shard is all-reduced over (hybrid sharding; the
  // engine's Create sets it from its replica communicator). With sharding.replica_reduce_format
  // other than WIRE_FP32 the plan holds the two wire buffers of the compressed all-reduce,
  // sized by it.
  int replicas = 1;
};

// sizeof(__nv_bfloat16), without CUDA's headers.
inline constexpr size_t kBf16Bytes = 2;

// At world 1 a unit's shard is the whole unit: the model accumulates its gradients straight
// into the shard's gradient (no full-unit buffer, no reduce-scatter).
inline bool DirectGradients(int world) { return world == 1; }

// Floats of the pinned kHostStats buffer: 6, then 2 x 3 uint64 of FP8 cast counts.
inline constexpr size_t kHostStatsFloats = 6 + 2 * 3 * 2;

// What a buffer is to the engine. Per-unit roles (GpuBuffer::index: the unit) are that unit's
// shard; kBlockWork and the staging roles come in slots 0 and 1 (index: the slot).
enum class GpuBufferRole {
  kModelArena,  // the CUDA model's one allocation (CreateCudaModel)
  kHeadWork,    // inside the arena: the gathered bf16 head (CudaModel::HeadWork)
  kParams,      // fp32 master
  kM,           // AdamW moments
  kV,
  kGrads,          // fp32 shard gradient
  kHostDecayMask,  // offloaded units: the host AdamW's decay mask, a byte a parameter
  kParamsBf16,     // offloaded units: the bf16 copy the gathers send
  kBlockWork,      // a gathered bf16 block
  kGradBuffer,     // beyond world 1: the head's and the block slots' fp32 gradients
  kGatherStaging,  // GatherUnit: the group's pieces of a chunk
  kGatherSource,   // GatherUnit with offload: a device copy of this rank's piece
  kNormScratch,    // SumOfSquares's partial sums
  kStats,          // [sum of squares, loss sum, targets that count]
  kGradScale,      // the clip scale
  // [sum of squares, loss sum, clip scale, targets that count] read by the host, [4] the
  // rank's count on its way to the device, and from float 6 (byte 24, 8-byte aligned) the FP8
  // casts' two Fp8CastCounts (kHostStatsFloats in all)
  kHostStats,
  kStagingGrads,         // offload: a shard gradient on its way to the host AdamW
  kStagingBf16,          // offload: bf16 weights on their way back
  kWireSend,             // hybrid, a replica_reduce_format other than fp32: the encoded shard
  kWireRecv,             // and what the replicas send back (comm/wire_codec.h), bytes
  kSmallBufferRounding,  // not allocated: what the small buffers may take beyond their size
};

// Who allocates a buffer.
enum class GpuBufferPlace {
  kDevice,      // the engine, cudaMalloc
  kPinnedHost,  // the engine, cudaMallocHost
  kModelArena,  // CreateCudaModel (the arena itself)
  kInArena,     // nobody: it lies inside the arena, which the engine asked to hold it
  kNowhere,     // nobody: a planned allowance
};

// Which GpuMemoryPlan total counts a buffer.
enum class GpuPlanPart { kState, kWorking, kActivations, kHost, kNone };

struct GpuBuffer {
  GpuBufferRole role = GpuBufferRole::kModelArena;
  int index = 0;  // the unit (per-unit roles), the slot (block work, staging), else 0
  GpuBufferPlace place = GpuBufferPlace::kDevice;
  GpuPlanPart part = GpuPlanPart::kWorking;
  size_t elements = 0;
  size_t element_bytes = 0;
  size_t bytes() const { return elements * element_bytes; }
};

// "unit 3 m", "block work 1", "gradient buffer": for messages and test traces.
std::string GpuBufferName(const GpuBuffer& buffer);

struct GpuBufferPlan {
  // In the order the engine allocates them: the model's arena and what lies in it, each
  // unit's shard buffers, then the working buffers.
  std::vector<GpuBuffer> buffers;
  // What CreateCudaModel is asked to hold (the kInArena buffers).
  engine::cuda::ArenaRequests arena_requests;
  // Beyond world 1, the layout of the kGradBuffer (fp32 elements): the head's gradient at 0;
  // block l's at block_grad_offset[l % 2]. The head and the slots take turns in one buffer
  // (HeadGradTakesTurnsWithBlocks: offset 0) or not (after the head's slot); the two slots
  // are one (ZeroCudaOptions::one_block_grad_slot: equal offsets) or not.
  bool head_grad_takes_turns = false;
  bool one_block_grad_slot = false;
  size_t block_grad_offset[2] = {0, 0};
  // GatherUnit's chunk: this many floats of each rank's shard at a time.
  size_t gather_chunk_floats = 0;
  // Summed from `buffers` (PlanGpuBuffers keeps them so).
  GpuMemoryPlan totals;

  // The buffer of `role` and `index`; null when the plan has none.
  const GpuBuffer* Find(GpuBufferRole role, int index = 0) const;
};

// Bytes of the CUDA model's allocation at a checkpointing plan and micro-batch rows (the
// job's sequence length is the caller's), `requests` included.
using ActivationBytesFn = std::function<size_t(
    const engine::CheckpointingPlan& level, int micro_batch_size,
    const engine::cuda::ArenaRequests& requests)>;

// Every buffer one rank of `spec` allocates at this checkpointing plan, micro-batch rows and
// world size (the ranks each unit is sharded over) with units [first_offloaded, n) offloaded
// (n: none; memory_plan.h's FirstOffloadedUnit gives the spec's), and their totals.
GpuBufferPlan PlanGpuBuffers(const weft::v1::JobSpec& spec, const engine::ModelArch& arch,
                             const engine::CheckpointingPlan& level, int micro_batch_size,
                             int world, int first_offloaded,
                             const ActivationBytesFn& activation_bytes,
                             const ZeroCudaOptions& options = {});

// The GpuMemoryPlan totals of `buffers`: each part the sum of the buffers it counts; the
// activations the model's arena less the shard gradients that lie in it (counted with the
// state); the reserve for what the engine does not allocate itself.
GpuMemoryPlan SumGpuBuffers(const std::vector<GpuBuffer>& buffers);

// What one GPU rank runs with: the memory decision (DecideMemory over PlanGpuBuffers) and the
// optimizer offload under it, the spec's units or, with optimizer.offload_auto where the job
// does not fit, the least offload that does once DecideMemory has recomputed as much as the
// job allows (ranks may choose differently: offload moves no collective).
struct GpuMemoryDecision {
  MemoryDecision memory;
  int first_offloaded = 0;  // units [first_offloaded, n) step on the host
  bool auto_offloaded = false;  // offload_auto chose first_offloaded
  // OK, or this rank's refusal: the GPU's (with the offload that would also fit) or, for the
  // offload's pinned memory, the host's (CheckHostMemory).
  absl::Status fits;
  // For the job's MEMORY_PLANNED event: memory.reason and, with offload, which units step on
  // the host and why (or that offload_auto kept the optimizer on the GPU).
  std::string note;
  // When it fits: every buffer of memory.plan (whose totals are memory.plan), for the engine
  // to allocate.
  GpuBufferPlan buffers;
};

// Every plan must fit `device_free_bytes`, or training.device_memory_limit_gib where that is
// less (the reasons say which bound it); `host_available_bytes` and `ranks_on_host`:
// CheckHostMemory's.
GpuMemoryDecision DecideGpuMemory(const weft::v1::JobSpec& spec, const engine::ModelArch& arch,
                                  int world, size_t device_free_bytes,
                                  size_t host_available_bytes, int ranks_on_host,
                                  const ActivationBytesFn& activation_bytes,
                                  const ZeroCudaOptions& options = {});

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_GPU_MEMORY_PLAN_H_
