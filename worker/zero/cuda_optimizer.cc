#include "worker/zero/cuda_optimizer.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/ops.h"

namespace weft::zero {

namespace cuda = engine::cuda;

bool ZeroCudaOptimizer::PendingUpdate::any() const {
  for (const auto& r : ranges) {
    if (!r.empty()) return true;
  }
  return false;
}

ZeroCudaOptimizer::ZeroCudaOptimizer(const Config& config)
    : config_(config),
      host_threads_(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {}

ZeroCudaOptimizer::~ZeroCudaOptimizer() {
  for (cudaEvent_t e : {grads_copied_[0], grads_copied_[1], weights_copied_[0],
                        weights_copied_[1]}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

std::vector<DecayRun> DecayRuns(const std::vector<uint8_t>& mask) {
  std::vector<DecayRun> runs;
  for (size_t i = 0; i < mask.size(); ++i) {
    const bool decay = mask[i] != 0;
    if (runs.empty() || runs.back().decay != decay) runs.push_back({i, i, decay});
    runs.back().end = i + 1;
  }
  return runs;
}

absl::StatusOr<std::unique_ptr<ZeroCudaOptimizer>> ZeroCudaOptimizer::Create(
    const Config& config) {
  std::unique_ptr<ZeroCudaOptimizer> opt(new ZeroCudaOptimizer(config));
  const ShardLayout& layout = *config.layout;
  if (config.update_in_next_forward && config.head_work != nullptr) {
    const auto address = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    const uintptr_t head_begin = address(config.head_work);
    const uintptr_t head_end = head_begin + config.head_slot_elements * sizeof(bf16);
    for (int u = 1; u < layout.num_units(); ++u) {
      const uintptr_t grads = address((*config.shards)[u].grads);
      if (grads < head_end && head_begin < grads + layout.unit(u).shard * sizeof(float)) {
        opt->under_head_work_.push_back(u);
      }
    }
  }
  if (opt->any_offloaded()) {
    for (int i = 0; i < 2; ++i) {
      if (config.staging_grads[i] == nullptr || config.staging_bf16[i] == nullptr) {
        return absl::InvalidArgumentError("optimizer offload without its staging pairs");
      }
      WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&opt->grads_copied_[i],
                                                         cudaEventDisableTiming));
      WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&opt->weights_copied_[i],
                                                         cudaEventDisableTiming));
    }
  }
  return opt;
}

// ---- the step -------------------------------------------------------------------------------

absl::Status ZeroCudaOptimizer::Step(int64_t adamw_step, const engine::AdamWConfig& adamw) {
  if (any_offloaded()) return HostStep(adamw_step, adamw);
  if (config_.update_in_next_forward) return RecordPending(adamw_step, adamw);
  return DeviceStep(adamw_step, adamw);
}

absl::Status ZeroCudaOptimizer::RecordPending(int64_t adamw_step,
                                              const engine::AdamWConfig& adamw) {
  // Every unit's gather in this step's forward ran the last step's update.
  if (pending_.any()) return absl::InternalError("an update was left pending for two steps");
  const ShardLayout& layout = *config_.layout;
  pending_.adamw_step = adamw_step;
  pending_.adamw = adamw;
  pending_.ranges.assign(layout.num_units(), {});
  for (int u = 0; u < layout.num_units(); ++u) {
    const size_t shard = layout.unit(u).shard;
    auto& ranges = pending_.ranges[u];
    if (u == 0 && config_.head_split > 0) {
      // The input piece's part of this rank's shard, then the output piece's.
      const size_t first = static_cast<size_t>(config_.comm->rank()) * shard;
      const size_t split = std::clamp(config_.head_split, first, first + shard) - first;
      if (split > 0) ranges.emplace_back(0, split);
      if (split < shard) ranges.emplace_back(split, shard);
    } else {
      ranges.emplace_back(0, shard);
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaOptimizer::DeviceStep(int64_t adamw_step,
                                           const engine::AdamWConfig& adamw) const {
  for (int u = 0; u < config_.first_offloaded; ++u) {
    WEFT_RETURN_IF_ERROR(UpdateShardRange(u, 0, config_.layout->unit(u).shard, nullptr,
                                          adamw_step, adamw, config_.compute));
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaOptimizer::UpdateShardRange(int u, size_t begin, size_t end,
                                                 bf16* bf16_out, int64_t adamw_step,
                                                 const engine::AdamWConfig& adamw,
                                                 cudaStream_t stream) const {
  const CudaShard& unit = (*config_.shards)[u];
  // Only the elements whose moments the rank keeps.
  const size_t first = std::max(begin, unit.moments_begin);
  const size_t last = std::min(end, unit.moments_end);
  for (const DecayRun& r : unit.decay_runs) {
    const size_t from = std::max(r.begin, first), to = std::min(r.end, last);
    if (from >= to) continue;
    const size_t moment = from - unit.moments_begin;
    WEFT_RETURN_IF_ERROR(cuda::AdamWUpdate(
        unit.params + from, bf16_out == nullptr ? nullptr : bf16_out + (from - begin),
        unit.grads + from, unit.m + moment, unit.v + moment, to - from, r.decay, adamw,
        adamw_step, config_.grad_scale, stream));
  }
  return absl::OkStatus();
}

// Unit by unit, a pipeline of three: the GPU copies unit u + 1's gradients out while the host
// steps unit u, whose new bf16 weights the GPU copies in while the host steps unit u + 1. Two
// staging pairs alternate; the events say when each is free again. The units kept on the GPU
// step there, enqueued behind the first copy so the host has work while the GPU does them.
absl::Status ZeroCudaOptimizer::HostStep(int64_t adamw_step, const engine::AdamWConfig& adamw) {
  const ShardLayout& layout = *config_.layout;
  const std::vector<CudaShard>& units = *config_.shards;
  cudaStream_t compute = config_.compute;
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(config_.host_clip_scale, config_.grad_scale,
                                            sizeof(float), cudaMemcpyDeviceToHost, compute));
  const int first = config_.first_offloaded;
  const auto copy_out = [&](int u) -> absl::Status {
    const int slot = (u - first) % 2;
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(config_.staging_grads[slot], units[u].grads,
                                              layout.unit(u).shard * sizeof(float),
                                              cudaMemcpyDeviceToHost, compute));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(grads_copied_[slot], compute));
    return absl::OkStatus();
  };
  const int num_units = layout.num_units();
  WEFT_RETURN_IF_ERROR(copy_out(first));
  WEFT_RETURN_IF_ERROR(DeviceStep(adamw_step, adamw));
  for (int u = first; u < num_units; ++u) {
    const int slot = (u - first) % 2;
    if (u + 1 < num_units) WEFT_RETURN_IF_ERROR(copy_out(u + 1));
    // Through the communicator, so an abort (a peer lost) interrupts the wait.
    WEFT_RETURN_IF_ERROR(config_.comm->WaitEvent(grads_copied_[slot]));
    if (u - first >= 2) WEFT_RETURN_IF_ERROR(config_.comm->WaitEvent(weights_copied_[slot]));
    const CudaShard& unit = units[u];
    const size_t shard = layout.unit(u).shard;
    engine::AdamWUpdateParallel(unit.params, config_.staging_grads[slot], unit.m, unit.v,
                                unit.host_decay_mask, shard, adamw, adamw_step,
                                *config_.host_clip_scale, config_.staging_bf16[slot],
                                host_threads_);
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(unit.params_bf16, config_.staging_bf16[slot],
                                              shard * sizeof(bf16), cudaMemcpyHostToDevice,
                                              compute));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(weights_copied_[slot], compute));
  }
  return absl::OkStatus();
}

// ---- the update in the next forward ---------------------------------------------------------

bool ZeroCudaOptimizer::pending() const { return pending_.any(); }

absl::StatusOr<bool> ZeroCudaOptimizer::RunPending(int u, size_t begin, size_t end,
                                                   bf16* bf16_out, cudaStream_t stream) {
  if (pending_.ranges.empty()) return false;
  auto& ranges = pending_.ranges[u];
  bool wrote = false;
  for (auto it = ranges.begin(); it != ranges.end();) {
    const auto [from, to] = *it;
    if (to <= begin || end <= from) {
      ++it;
      continue;
    }
    if (bf16_out != nullptr && (from != begin || to != end)) {
      return absl::InternalError(absl::StrCat("unit ", u, ": pending range [", from, ", ", to,
                                              ") is not the gathered [", begin, ", ", end, ")"));
    }
    WEFT_RETURN_IF_ERROR(UpdateShardRange(u, from, to, bf16_out, pending_.adamw_step,
                                          pending_.adamw, stream));
    wrote = bf16_out != nullptr;
    it = ranges.erase(it);
  }
  return wrote;
}

absl::Status ZeroCudaOptimizer::RunPendingUnderHead(cudaStream_t stream) {
  for (int u : under_head_work_) {
    WEFT_RETURN_IF_ERROR(
        RunPending(u, 0, config_.layout->unit(u).shard, nullptr, stream).status());
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaOptimizer::Flush() {
  if (!pending_.any()) return absl::OkStatus();
  // Behind the step that left them (its gradients and clip scale are on compute already),
  // and behind any part an evaluation's forward ran on the comm stream: disjoint units.
  for (int u = 0; u < config_.layout->num_units(); ++u) {
    WEFT_RETURN_IF_ERROR(
        RunPending(u, 0, config_.layout->unit(u).shard, nullptr, config_.compute).status());
  }
  return config_.sync_compute();
}

void ZeroCudaOptimizer::Drop(int u) {
  if (!pending_.ranges.empty()) pending_.ranges[u].clear();
}

}  // namespace weft::zero
