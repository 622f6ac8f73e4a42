// The GPU memory plan of a job, decided before anything is allocated: what one rank needs at a
// given activation checkpointing plan, micro-batch and world size, and the choice among the
// levels — the requested one, or under AUTO the least recomputation that fits (block by block:
// the lightest uniform level that fits, then as many blocks one level lighter as still fit).
// DecideMemory is
// a pure function of its inputs (the device's free memory is one of them), so its choices and
// refusals are tested without a GPU.
#ifndef WEFT_WORKER_MEMORY_PLAN_H_
#define WEFT_WORKER_MEMORY_PLAN_H_

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/checkpointing.h"
#include "weft/v1/job.pb.h"

namespace weft::worker {

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

// /proc/meminfo's MemAvailable: what the host can give without swapping (SIZE_MAX when it
// cannot be read, so an unreadable file never refuses a job).
size_t HostAvailableBytes();

}  // namespace weft::worker

#endif  // WEFT_WORKER_MEMORY_PLAN_H_
