// The memory plan of a job, decided before anything is allocated. On a GPU: what one rank
// needs at a given activation checkpointing plan, micro-batch and world size, and the choice
// among the levels — the requested one, or under AUTO the least recomputation that fits (block
// by block: the lightest uniform level that fits, then as many blocks one level lighter as
// still fit). On the CPU: what one rank needs in host memory, against its share of what the
// host has available, with AUTO choosing a uniform level the same way. DecideMemory and
// DecideCpuMemory are pure functions of their inputs (the free or available memory is one of
// them), so their choices and refusals are tested without a GPU or a big host.
#ifndef WEFT_WORKER_ZERO_MEMORY_PLAN_H_
#define WEFT_WORKER_ZERO_MEMORY_PLAN_H_

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/checkpointing.h"
#include "weft/v1/job.pb.h"

namespace weft::zero {

// Device memory one rank of a GPU job needs.
struct GpuMemoryPlan {
  size_t state_bytes = 0;       // shards: fp32 params, m, v, grads (offloaded units: grads, bf16 params)
  size_t working_bytes = 0;     // gathered bf16 blocks, full fp32 gradient units, scratch
  // The CudaModel's allocation: activations, scratch, the gathered bf16 head (inside the
  // spent-activation gradients where they leave room), cuBLAS workspace.
  size_t activation_bytes = 0;
  size_t reserve_bytes = 0;     // NCCL buffers, CUDA context growth, allocator slack
  // Of state_bytes, the block gradients that lie over spent activations (ZeroCudaOptions).
  size_t spent_activation_grad_bytes = 0;
  // Device bytes in all; the pinned host memory below is not part of it.
  size_t total() const { return state_bytes + working_bytes + activation_bytes + reserve_bytes; }
  // Optimizer offload: fp32 master weights, moments and decay mask of the offloaded units'
  // shards, and the staging buffers, in pinned host memory. 0 without offload.
  size_t host_bytes = 0;
};

// "9.10 GiB (parameter/optimizer shards 1.50, gathered blocks and gradients 0.60, activations
// and gathered head 6.00, NCCL and runtime reserve 1.00)"; with gradients over spent
// activations, "activations and gathered head 6.00 beyond the 1.20 of shard gradients they
// hold".
std::string DescribeGpuMemoryPlan(const GpuMemoryPlan& plan);

// The plan of the job at a checkpointing plan, micro-batch rows per rank and world size.
using MemoryPlanner = std::function<GpuMemoryPlan(const engine::CheckpointingPlan& level,
                                                  int micro_batch_size, int world)>;

struct MemoryDecision {
  bool fits = false;
  // When it fits: the checkpointing to run at, and its plan.
  engine::CheckpointingPlan level;
  GpuMemoryPlan plan;
  // For the job's events when it fits; when it does not, the error: the numbers and what would
  // fit (another level, fewer micro-batch rows, more GPUs).
  std::string reason;
};

// `requested`: the job's training.activation_checkpointing (AUTO or UNSPECIFIED: the least
// recomputation that fits, trying none, selective, full in that order, then under the first
// that fits as many of the model's `num_layers` blocks one level lighter as fit; a named level
// runs uniform).
// `budget` names what free_bytes is in the reason: "free" (the device's free memory), or the
// job's limit ("allowed by training.device_memory_limit_gib").
MemoryDecision DecideMemory(weft::v1::ActivationCheckpointing::Level requested,
                            size_t free_bytes, int micro_batch_size, int world, int num_layers,
                            const MemoryPlanner& plan, std::string_view budget = "free");

// Optimizer offload takes whole units from the end (the last block first, the head last):
// units [first, n) of `unit_sizes` are offloaded. This returns `first` for the optimizer's
// settings: n without offload, 0 for offload with offload_fraction 0 (all) or 1, otherwise the
// largest first whose units hold at least offload_fraction of the parameters.
int FirstOffloadedUnit(const std::vector<size_t>& unit_sizes,
                       const weft::v1::OptimizerSpec& optimizer);

// The offload_fraction to write for offloading units [first, n): the shortest decimal (at
// least two places) that FirstOffloadedUnit maps back to `first` ("0.62").
std::string OffloadFractionFor(const std::vector<size_t>& unit_sizes, int first);

// For a job that does not fit the GPU with units [current_first, n) offloaded: the least
// offload that fits, the largest first below current_first with plan_at(first).total() <=
// free_bytes; -1 when even offloading everything does not fit. (optimizer.offload_auto runs
// at it.)
int LeastOffloadThatFits(int current_first, size_t free_bytes,
                         const std::function<GpuMemoryPlan(int first)>& plan_at);

// LeastOffloadThatFits as a hint naming the fields to set and both memory figures; empty when
// even offloading everything does not fit.
std::string OffloadThatFits(const std::vector<size_t>& unit_sizes, int current_first,
                            size_t free_bytes,
                            const std::function<GpuMemoryPlan(int first)>& plan_at);

// The pinned host memory of optimizer offload (plan.host_bytes, 0 without offload) of the job's
// `ranks_on_host` ranks on this host (each pins as much) against what the host has available:
// OK, or RESOURCE_EXHAUSTED with the figures. Every rank of a host must check before any of
// them pins (ZeroCudaEngine::Create agrees on it across ranks), or the later ones would count
// the earlier ones' memory twice.
absl::Status CheckHostMemory(const GpuMemoryPlan& plan, size_t host_available_bytes, int world,
                             int ranks_on_host = 1);

// Host memory one rank of a CPU job (ZeroCpuEngine, worker/zero/zero_cpu.h) needs: what the engine,
// its model and the checkpointer allocate, and a reserve for the rest of the process.
// PlanCpuMemory (worker/zero/zero_cpu.h) computes it from the same sizes the engine allocates by.
struct CpuMemoryPlan {
  // Kept for the whole run: the fp32 params, gradients, AdamW m and v and the decay mask of
  // what the rank keeps of each unit (its shard; the whole padded unit at stage 0), plus at
  // stages 1-2 the resident full parameters and at stages 0-2 the full-unit gradients a
  // backward accumulates into.
  size_t state_bytes = 0;
  // Stage 3's gathered units (two block slots and the head), their full gradients and the
  // reduce-scatter outputs (stages 1-2: the outputs only); the micro-batch's tokens; the one
  // unit gathered whole for the model file at the end.
  size_t working_bytes = 0;
  // The CPU model's activations and scratch for the micro-batch (CpuModel::ActivationBytes).
  size_t activation_bytes = 0;
  // The host copy a writing rank keeps for its checkpoint saves (params, m and v of its shard:
  // Checkpointer::Prepare allocates it after the engine); 0 without saves or on a rank that
  // does not write.
  size_t checkpoint_bytes = 0;
  // The communicator's scratch (Gloo's pieces of a collective) and the process itself.
  size_t reserve_bytes = 0;
  size_t total() const {
    return state_bytes + working_bytes + activation_bytes + checkpoint_bytes + reserve_bytes;
  }
};

// "3.10 GiB (parameter/optimizer state 1.50 GiB, gathered units and buffers 600.0 MiB,
// activations 1.20 GiB, checkpoint copy 100.0 MiB, communication and process reserve
// 160.0 MiB)": each part in GiB from one up, else in MiB.
std::string DescribeCpuMemoryPlan(const CpuMemoryPlan& plan);

// The plan of a CPU job at a (uniform) checkpointing level, micro-batch rows per rank, group
// size (the ranks each unit is sharded over) and ZeRO stage.
using CpuMemoryPlanner = std::function<CpuMemoryPlan(engine::Checkpointing level,
                                                     int micro_batch_size, int group, int stage)>;

struct CpuMemoryDecision {
  bool fits = false;
  // When it fits: the level to run at and its plan; when not, the last level tried and its.
  engine::Checkpointing level = engine::Checkpointing::kNone;
  CpuMemoryPlan plan;
  // When it fits, for the job's events (MEMORY_PLANNED); when not, the error: every part of
  // the need, the budget, and what would fit (another level, fewer micro-batch rows, ZeRO
  // stage 3, more ranks).
  std::string reason;
};

// Each rank of a host gets an equal share of what the host has available,
// host_available_bytes / ranks_on_host (the job's ranks on this host; < 1 counts as 1), the
// same rule CheckHostMemory follows, so every rank of a host that reads the same MemAvailable
// decides alike and none counts another's memory: every rank must decide before any of them
// allocates (ZeroCpuEngine::Create agrees on it across ranks first).
// `requested`: the job's training.activation_checkpointing; AUTO (or UNSPECIFIED) takes the
// least recomputation that fits, trying none, selective and full in that order; a named level
// is the only one tried. `hybrid`: the group is a sharding group (its size is not
// resources.min_workers), which only changes how the "more ranks" hint is worded.
CpuMemoryDecision DecideCpuMemory(weft::v1::ActivationCheckpointing::Level requested,
                                  size_t host_available_bytes, int ranks_on_host,
                                  int micro_batch_size, int group, int stage, bool hybrid,
                                  const CpuMemoryPlanner& plan);

// /proc/meminfo's MemAvailable: what the host can give without swapping (SIZE_MAX when it
// cannot be read, so an unreadable file never refuses a job).
size_t HostAvailableBytes();

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_MEMORY_PLAN_H_
