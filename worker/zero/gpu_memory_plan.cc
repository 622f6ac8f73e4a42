#include "worker/zero/gpu_memory_plan.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "worker/comm/wire_codec.h"
#include "worker/zero/shard_layout.h"
#include "worker/zero/sharding_groups.h"
#include "worker/zero/zero_engine.h"

namespace weft::zero {
namespace {

using Role = GpuBufferRole;
using Place = GpuBufferPlace;
using Part = GpuPlanPart;

// NCCL's channel buffers (a few hundred MiB on NVLink machines), cuBLAS's own handles and the
// CUDA context's growth after creation: not allocated by the engine, but they must fit. On an
// H200, GPT-2 124M on 1 GPU measured 1.26 GiB of device memory beyond the engine's own.
constexpr size_t kReserveBytes = size_t{3} << 29;  // 1.5 GiB

// GatherUnit's device staging: the world's pieces of one chunk of a unit (64 MiB in all), so
// the end-of-job gather never needs a whole fp32 unit on the device.
constexpr size_t kGatherStagingFloats = size_t{16} << 20;

// The small device buffers (stats, grad scale) are planned at 4 KiB in all: cudaMalloc gives
// each at least its granularity, more than their few bytes.
constexpr size_t kSmallBuffersBytes = 4096;

size_t GatherChunkFloats(int world) {
  return std::max<size_t>(1, kGatherStagingFloats / static_cast<size_t>(world));
}

// Elements of the head's working buffers (its gathered bf16 copy and, beyond world 1, its
// fp32 gradient): the whole padded unit, or for a head that splits (HeadOutputBegin) the
// larger of its two pieces, which take turns in them.
size_t HeadSlotElements(const engine::ModelArch& arch, const ShardLayout& layout) {
  const size_t split = arch.HeadOutputBegin();
  const size_t size = layout.unit(0).size;
  return split == 0 ? layout.unit(0).padded : std::max(split, size - split);
}

// Whether the head's fp32 gradient takes turns with the block slots' in one buffer
// (GradBufferElements) instead of having its own: beyond world 1, for plans that recompute the
// last block, since such plans trade time for memory (the buffer is a split head's larger
// piece, 2.1 GB at Llama-8B, 4.2 GB at 70B; a tied head's whole unit, 0.8 GB at GPT 6.7B). It
// costs waits: block L-1's backward writes its gradient only once the LM head's has been
// reduced (behind that block's recomputation, which writes no gradient), and the embedding's
// backward only once blocks 1 and 0 have been reduce-scattered. A tied head is reduced twice:
// its LM head's gradient after the classifier, its embedding's added at the end.
bool HeadGradTakesTurnsWithBlocks(const engine::ModelArch& arch,
                                  const engine::CheckpointingPlan& level, int world) {
  return !DirectGradients(world) && arch.num_layers() > 0 &&
         level.At(arch.num_layers() - 1) != engine::Checkpointing::kNone;
}

// Whether the blocks' fp32 gradients take turns in one buffer beyond world 1
// (ZeroCudaOptions::one_block_grad_slot): where every block recomputes its whole forward,
// which hides the previous block's reduce-scatter.
bool OneBlockGradSlot(const engine::CheckpointingPlan& level, int world,
                      const ZeroCudaOptions& options) {
  return options.one_block_grad_slot && !DirectGradients(world) &&
         level.level == engine::Checkpointing::kFull && level.lighter_count() == 0;
}

// Elements of the fp32 gradient buffer beyond world 1: the head's and the block slots' (one
// or two), or one buffer they take turns in (HeadGradTakesTurnsWithBlocks).
size_t GradBufferElements(const engine::ModelArch& arch, const ShardLayout& layout,
                          bool head_takes_turns, bool one_block_slot) {
  const size_t head = HeadSlotElements(arch, layout);
  const size_t blocks = (one_block_slot ? 1 : 2) * layout.max_block_padded();
  return head_takes_turns ? std::max(head, blocks) : head + blocks;
}

// Bytes of each block's shard gradient (units 1 and up) to place over spent activations, or
// none: only a step without gradient accumulation, where a gradient is written once, by its
// block's backward or reduce-scatter, and read before the next forward (the optimizer's).
std::vector<size_t> SpentActivationGradBytes(const weft::v1::JobSpec& spec,
                                             const ShardLayout& layout,
                                             const ZeroCudaOptions& options) {
  std::vector<size_t> bytes;
  if (!options.gradients_over_spent_activations || spec.training().grad_accum_steps() != 1) {
    return bytes;
  }
  for (int u = 1; u < layout.num_units(); ++u) {
    bytes.push_back(layout.unit(u).shard * sizeof(float));
  }
  return bytes;
}

GpuBuffer Buffer(Role role, int index, Place place, Part part, size_t elements,
                 size_t element_bytes) {
  return {role, index, place, part, elements, element_bytes};
}

// A unit's shard: fp32 master, m, v and gradient, 16 bytes a parameter as PyTorch's FSDP keeps
// (the bf16 copy the all-gathers send is cast from the master as each gather starts).
// Offloaded, the master, moments and a decay mask live in pinned host memory (which kernels
// and copies reach through unified addressing) and the device keeps the gradient and a bf16
// copy. The gradient lies in the model's arena where the engine asked for it there.
// With the optimizer shared out over the replicas, m and v are of the rank's piece (`moments`
// elements; the shard otherwise).
void AddUnitBuffers(int u, size_t shard, size_t moments, bool offloaded, bool grads_in_arena,
                    std::vector<GpuBuffer>* out) {
  const Place kept = offloaded ? Place::kPinnedHost : Place::kDevice;
  const Part kept_part = offloaded ? Part::kHost : Part::kState;
  out->push_back(Buffer(Role::kParams, u, kept, kept_part, shard, sizeof(float)));
  for (Role role : {Role::kM, Role::kV}) {
    out->push_back(Buffer(role, u, kept, kept_part, moments, sizeof(float)));
  }
  out->push_back(Buffer(Role::kGrads, u, grads_in_arena ? Place::kInArena : Place::kDevice,
                        Part::kState, shard, sizeof(float)));
  if (offloaded) {
    out->push_back(Buffer(Role::kHostDecayMask, u, Place::kPinnedHost, Part::kHost, shard, 1));
    out->push_back(Buffer(Role::kParamsBf16, u, Place::kDevice, Part::kState, shard, kBf16Bytes));
  }
}

// Two gathered bf16 block slots; beyond world 1 the fp32 gradient buffer (`grad_elements`);
// GatherUnit's staging beyond world 1; the norm's scratch and the scalars.
void AddWorkingBuffers(const ShardLayout& layout, int world, bool offload, size_t grad_elements,
                       std::vector<GpuBuffer>* out) {
  for (int slot = 0; slot < 2; ++slot) {
    out->push_back(Buffer(Role::kBlockWork, slot, Place::kDevice, Part::kWorking,
                          layout.max_block_padded(), kBf16Bytes));
  }
  if (!DirectGradients(world)) {
    out->push_back(Buffer(Role::kGradBuffer, 0, Place::kDevice, Part::kWorking, grad_elements,
                          sizeof(float)));
  }
  if (world > 1) {  // one rank's GatherUnit copies its shard straight out
    const size_t chunk = GatherChunkFloats(world);
    out->push_back(Buffer(Role::kGatherStaging, 0, Place::kDevice, Part::kWorking,
                          chunk * world, sizeof(float)));
    if (offload) {
      out->push_back(Buffer(Role::kGatherSource, 0, Place::kDevice, Part::kWorking, chunk,
                            sizeof(float)));
    }
  }
  out->push_back(Buffer(Role::kNormScratch, 0, Place::kDevice, Part::kWorking,
                        engine::cuda::SumOfSquaresScratchFloats(layout.max_shard()),
                        sizeof(float)));
  out->push_back(Buffer(Role::kStats, 0, Place::kDevice, Part::kWorking, 3, sizeof(float)));
  out->push_back(Buffer(Role::kGradScale, 0, Place::kDevice, Part::kWorking, 1, sizeof(float)));
  // In no total: 72 pinned bytes, and host_bytes is optimizer offload's (0 without it, as
  // CheckHostMemory takes it).
  out->push_back(Buffer(Role::kHostStats, 0, Place::kPinnedHost, Part::kNone, kHostStatsFloats,
                        sizeof(float)));
  out->push_back(Buffer(Role::kSmallBufferRounding, 0, Place::kNowhere, Part::kWorking,
                        kSmallBuffersBytes - 3 * sizeof(float), 1));
}

// Optimizer offload's two staging pairs on the host (fp32 gradients in, bf16 weights out),
// each of the largest offloaded shard.
void AddOffloadStaging(size_t max_offloaded_shard, std::vector<GpuBuffer>* out) {
  for (int slot = 0; slot < 2; ++slot) {
    out->push_back(Buffer(Role::kStagingGrads, slot, Place::kPinnedHost, Part::kHost,
                          max_offloaded_shard, sizeof(float)));
    out->push_back(Buffer(Role::kStagingBf16, slot, Place::kPinnedHost, Part::kHost,
                          max_offloaded_shard, kBf16Bytes));
  }
}

// Hybrid sharding with a compressed replica all-reduce: its send and receive buffers, each
// of the largest shard's encoding (comm::WireBufferBytes), reused unit after unit on the
// replica stream.
void AddReplicaWireBuffers(const weft::v1::JobSpec& spec, const ShardLayout& layout,
                           int replicas, std::vector<GpuBuffer>* out) {
  const comm::WireFormat format = ReplicaWireFormat(spec.sharding());
  if (replicas <= 1 || format == comm::WireFormat::kFp32) return;
  const size_t bytes = comm::WireBufferBytes(format, layout.max_shard(), replicas);
  out->push_back(Buffer(Role::kWireSend, 0, Place::kDevice, Part::kWorking, bytes, 1));
  out->push_back(Buffer(Role::kWireRecv, 0, Place::kDevice, Part::kWorking, bytes, 1));
}

// training.device_memory_limit_gib in bytes; 0 for none.
size_t DeviceMemoryLimitBytes(const weft::v1::TrainingSpec& training) {
  const double gib = training.device_memory_limit_gib();
  if (!(gib > 0.0)) return 0;
  return static_cast<size_t>(std::min(gib * 1073741824.0, 1.8e19));
}

// The note's offload part: which units step on the host and why, or that offload_auto kept
// the optimizer on the GPU.
std::string OffloadNote(const weft::v1::OptimizerSpec& optimizer,
                        const std::vector<size_t>& unit_sizes, int first_offloaded,
                        bool auto_offloaded) {
  const int units = static_cast<int>(unit_sizes.size());
  if (first_offloaded < units) {
    return absl::StrCat("; optimizer offloaded to the host for units ", first_offloaded, "-",
                        units - 1, " of 0-", units - 1, " (offload_fraction ",
                        OffloadFractionFor(unit_sizes, first_offloaded), ")",
                        auto_offloaded ? ", the least that fits (optimizer.offload_auto)" : "");
  }
  if (optimizer.offload_auto()) {
    return "; optimizer kept on the GPU (optimizer.offload_auto: the job fits)";
  }
  return "";
}

}  // namespace

std::string GpuBufferName(const GpuBuffer& buffer) {
  const auto unit = [&](const char* what) {
    return absl::StrCat("unit ", buffer.index, " ", what);
  };
  const auto slot = [&](const char* what) { return absl::StrCat(what, " ", buffer.index); };
  switch (buffer.role) {
    case Role::kModelArena: return "model arena";
    case Role::kHeadWork: return "gathered head";
    case Role::kParams: return unit("params");
    case Role::kM: return unit("m");
    case Role::kV: return unit("v");
    case Role::kGrads: return unit("grads");
    case Role::kHostDecayMask: return unit("host decay mask");
    case Role::kParamsBf16: return unit("bf16 params");
    case Role::kBlockWork: return slot("block work");
    case Role::kGradBuffer: return "gradient buffer";
    case Role::kGatherStaging: return "gather staging";
    case Role::kGatherSource: return "gather source";
    case Role::kNormScratch: return "norm scratch";
    case Role::kStats: return "stats";
    case Role::kGradScale: return "grad scale";
    case Role::kHostStats: return "host stats";
    case Role::kStagingGrads: return slot("staging grads");
    case Role::kStagingBf16: return slot("staging bf16");
    case Role::kWireSend: return "wire send";
    case Role::kWireRecv: return "wire receive";
    case Role::kSmallBufferRounding: return "small buffer rounding";
  }
  return "?";
}

const GpuBuffer* GpuBufferPlan::Find(GpuBufferRole role, int index) const {
  for (const GpuBuffer& b : buffers) {
    if (b.role == role && b.index == index) return &b;
  }
  return nullptr;
}

GpuMemoryPlan SumGpuBuffers(const std::vector<GpuBuffer>& buffers) {
  GpuMemoryPlan plan;
  size_t arena = 0;
  for (const GpuBuffer& b : buffers) {
    switch (b.part) {
      case Part::kState: plan.state_bytes += b.bytes(); break;
      case Part::kWorking: plan.working_bytes += b.bytes(); break;
      case Part::kActivations: arena += b.bytes(); break;
      case Part::kHost: plan.host_bytes += b.bytes(); break;
      case Part::kNone: break;
    }
    if (b.place == Place::kInArena && b.part == Part::kState) {
      plan.spent_activation_grad_bytes += b.bytes();
    }
  }
  // The gradients in the arena are counted with the shards (16 bytes a parameter), and only
  // what the activations need beyond them here.
  plan.activation_bytes = arena - plan.spent_activation_grad_bytes;
  plan.reserve_bytes = kReserveBytes;
  return plan;
}

GpuBufferPlan PlanGpuBuffers(const weft::v1::JobSpec& spec, const engine::ModelArch& arch,
                             const engine::CheckpointingPlan& level, int micro_batch_size,
                             int world, int first_offloaded,
                             const ActivationBytesFn& activation_bytes,
                             const ZeroCudaOptions& options) {
  // Every rank's shards are the same size, so rank 0's layout speaks for all.
  const ShardLayout layout(UnitSizes(arch), world, /*rank=*/0,
                           ReplicaPieces(options.replicas, /*replica_rank=*/0));
  const bool shards_moments = ShardsOptimizer(spec.sharding(), options.replicas);
  GpuBufferPlan plan;
  const size_t head_slot = HeadSlotElements(arch, layout);
  // The model's arena holds the block gradients over spent activations and the gathered head,
  // which the model places inside those gradients where they leave room past the activations
  // (it is read only up to the classifier).
  plan.arena_requests = {SpentActivationGradBytes(spec, layout, options), head_slot};
  plan.arena_requests.fp8_linears = spec.precision() == weft::v1::FP8;
  plan.buffers.push_back(Buffer(Role::kModelArena, 0, Place::kModelArena, Part::kActivations,
                                activation_bytes(level, micro_batch_size, plan.arena_requests),
                                1));
  plan.buffers.push_back(
      Buffer(Role::kHeadWork, 0, Place::kInArena, Part::kNone, head_slot, kBf16Bytes));
  size_t max_offloaded_shard = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    const size_t shard = layout.unit(u).shard;
    const bool offloaded = u >= first_offloaded;
    if (offloaded) max_offloaded_shard = std::max(max_offloaded_shard, shard);
    AddUnitBuffers(u, shard, shards_moments ? layout.unit(u).piece : shard, offloaded,
                   u > 0 && !plan.arena_requests.spent_grad_bytes.empty(), &plan.buffers);
  }
  plan.head_grad_takes_turns = HeadGradTakesTurnsWithBlocks(arch, level, world);
  plan.one_block_grad_slot = OneBlockGradSlot(level, world, options);
  plan.block_grad_offset[0] = plan.head_grad_takes_turns ? 0 : head_slot;
  plan.block_grad_offset[1] =
      plan.block_grad_offset[0] + (plan.one_block_grad_slot ? 0 : layout.max_block_padded());
  plan.gather_chunk_floats = GatherChunkFloats(world);
  AddWorkingBuffers(layout, world, max_offloaded_shard > 0,
                    GradBufferElements(arch, layout, plan.head_grad_takes_turns,
                                       plan.one_block_grad_slot),
                    &plan.buffers);
  AddReplicaWireBuffers(spec, layout, options.replicas, &plan.buffers);
  if (max_offloaded_shard > 0) AddOffloadStaging(max_offloaded_shard, &plan.buffers);
  plan.totals = SumGpuBuffers(plan.buffers);
  return plan;
}

GpuMemoryDecision DecideGpuMemory(const weft::v1::JobSpec& spec, const engine::ModelArch& arch,
                                  int world, size_t device_free_bytes,
                                  size_t host_available_bytes, int ranks_on_host,
                                  const ActivationBytesFn& activation_bytes,
                                  const ZeroCudaOptions& options) {
  // The job's limit, where it binds, is what every plan below must fit.
  size_t free_bytes = device_free_bytes;
  std::string_view budget = "free";
  if (const size_t limit = DeviceMemoryLimitBytes(spec.training());
      limit > 0 && limit < free_bytes) {
    free_bytes = limit;
    budget = "allowed by training.device_memory_limit_gib";
  }
  const std::vector<size_t> unit_sizes = UnitSizes(arch);
  const int rows = spec.training().micro_batch_size();
  GpuMemoryDecision d;
  d.first_offloaded = FirstOffloadedUnit(unit_sizes, spec.optimizer());
  const auto decide = [&](int first) {
    return DecideMemory(spec.training().activation_checkpointing(), free_bytes, rows, world,
                        arch.num_layers(),
                        [&](const engine::CheckpointingPlan& level, int r, int w) {
                          return PlanGpuBuffers(spec, arch, level, r, w, first,
                                                activation_bytes, options)
                              .totals;
                        },
                        budget);
  };
  d.memory = decide(d.first_offloaded);
  // Offloading (more of) the optimizer is the one remedy DecideMemory does not weigh: at the
  // checkpointing it ended at, how much would fit.
  const engine::CheckpointingPlan heaviest = d.memory.level;
  const auto plan_at = [&](int first) {
    return PlanGpuBuffers(spec, arch, heaviest, rows, world, first, activation_bytes, options)
        .totals;
  };
  if (!d.memory.fits && spec.optimizer().offload_auto()) {
    // Recomputation first (DecideMemory went as far as the job allows), then the least offload
    // on top; the host step is the slowest part of an offloaded step.
    const int first = LeastOffloadThatFits(d.first_offloaded, free_bytes, plan_at);
    if (first >= 0) {
      d.first_offloaded = first;
      d.memory = decide(first);
      d.auto_offloaded = d.memory.fits;
    }
  }
  if (!d.memory.fits) {
    const std::string offload = OffloadThatFits(unit_sizes, d.first_offloaded, free_bytes, plan_at);
    d.fits = absl::ResourceExhaustedError(
        offload.empty() ? d.memory.reason
                        : absl::StrCat(d.memory.reason, " It would also fit with ", offload, "."));
  } else {
    d.fits = CheckHostMemory(d.memory.plan, host_available_bytes, world, ranks_on_host);
  }
  d.note = absl::StrCat(d.memory.reason, OffloadNote(spec.optimizer(), unit_sizes,
                                                     d.first_offloaded, d.auto_offloaded));
  if (d.memory.fits) {  // the plan DecideMemory chose, buffer by buffer
    d.buffers = PlanGpuBuffers(spec, arch, d.memory.level, rows, world, d.first_offloaded,
                               activation_bytes, options);
  }
  return d;
}

}  // namespace weft::zero
