// The GPU engine's optimizer (worker/zero/zero_cuda.h): AdamW over this rank's shards, on the
// GPU over runs of equal weight decay, or on the host for the offloaded units
// (optimizer.offload: memory_plan.h's FirstOffloadedUnit), and the update deferred into the
// next forward (ZeroCudaOptions::update_in_next_forward).
//
// The engine keeps the stream schedule (gathers, reduce-scatters, events, collectives) and
// the per-unit state both sides read (CudaShard); this class owns what only the optimizer
// needs: the pending update of the last step, the events that free the host step's staging
// pairs (the engine's memory) and the host AdamW's threads. It enqueues on the streams the
// engine hands it and synchronises the host only where a method says so.
#ifndef WEFT_WORKER_ZERO_CUDA_OPTIMIZER_H_
#define WEFT_WORKER_ZERO_CUDA_OPTIMIZER_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/engine/adamw.h"
#include "worker/zero/shard_layout.h"

namespace weft::zero {

// Elements [begin, end) of a shard, all decayed or all not.
struct DecayRun {
  size_t begin = 0;
  size_t end = 0;
  bool decay = false;
};

// The runs of equal decay in a kept decay mask (so the device keeps a few runs per unit, not
// a byte per parameter).
std::vector<DecayRun> DecayRuns(const std::vector<uint8_t>& mask);

// This rank's shard of one unit (ShardLayout::unit(u).shard elements each), shared by the
// engine (gathers, reduce-scatters, checkpoints) and its optimizer.
struct CudaShard {
  float* params = nullptr;  // fp32 master
  // AdamW's moments, of shard elements [moments_begin, moments_end) (m[0] is element
  // moments_begin): the whole shard, or the rank's piece when the replicas share the optimizer
  // out. The optimizer steps only that range.
  float* m = nullptr;
  float* v = nullptr;
  size_t moments_begin = 0;
  size_t moments_end = 0;
  float* grads = nullptr;
  std::vector<DecayRun> decay_runs;  // covering the shard (units stepped on the GPU)
  // Optimizer offload only: the bf16 copy the gathers send, and the host AdamW's mask.
  __nv_bfloat16* params_bf16 = nullptr;
  uint8_t* host_decay_mask = nullptr;
};

class ZeroCudaOptimizer {
 public:
  using bf16 = __nv_bfloat16;

  // What the optimizer works on, none of it owned; every pointer outlives the optimizer.
  struct Config {
    const ShardLayout* layout = nullptr;
    // One per unit of `layout`; the vector is not resized while the optimizer lives.
    const std::vector<CudaShard>* shards = nullptr;
    comm::CudaCommunicator* comm = nullptr;  // the group: its rank, and host waits on events
    cudaStream_t compute = nullptr;          // where steps at the end of TrainStep run
    const float* grad_scale = nullptr;       // device scalar: the step's clip scale
    float* host_clip_scale = nullptr;        // one pinned float the host step reads it into
    int first_offloaded = 0;                 // units [first_offloaded, n) step on the host
    size_t head_split = 0;                   // ModelArch::HeadOutputBegin
    bool update_in_next_forward = true;      // ZeroCudaOptions::update_in_next_forward
    // The gathered head (null: none) and its elements, whose memory may lie over block
    // gradients (CudaModel::HeadWork): those units' pending updates must run before it fills.
    const bf16* head_work = nullptr;
    size_t head_slot_elements = 0;
    // The host waits for the work enqueued on compute so far (the engine's SyncCompute).
    std::function<absl::Status()> sync_compute;
    // With units offloaded, the host step's two staging pairs, pinned host memory of the
    // largest offloaded shard each (fp32 gradients in, bf16 weights out): the engine's, from
    // its buffer plan (gpu_memory_plan.h, GpuBufferRole::kStagingGrads and kStagingBf16).
    float* staging_grads[2] = {nullptr, nullptr};
    uint16_t* staging_bf16[2] = {nullptr, nullptr};
  };

  // Creates the host step's events, with units offloaded (INVALID_ARGUMENT when the staging
  // pairs are missing); finds the units under the gathered head. A CUDA error as its status.
  static absl::StatusOr<std::unique_ptr<ZeroCudaOptimizer>> Create(const Config& config);
  ~ZeroCudaOptimizer();
  ZeroCudaOptimizer(const ZeroCudaOptimizer&) = delete;
  ZeroCudaOptimizer& operator=(const ZeroCudaOptimizer&) = delete;

  // The step of TrainStep, once the clip scale is on the device (enqueued on compute before
  // this call). With units offloaded: every offloaded unit's gradients out, AdamW on the host,
  // bf16 weights in, the others stepped on the GPU meanwhile; the host waits for each unit's
  // gradients through the communicator (an abort ends the wait), not for the last copies in.
  // With update_in_next_forward: the step is only recorded, and the next forward's gathers
  // run it (RunPending); INTERNAL when the last step's was not all run. Otherwise every unit
  // steps now on compute. `adamw_step`: the 1-based count the bias corrections take.
  absl::Status Step(int64_t adamw_step, const engine::AdamWConfig& adamw);

  // Whether a recorded step is still to run on some shard range.
  bool pending() const;

  // On `stream`: the pending update of unit u's shard ranges that meet [begin, end); with
  // `bf16_out` ([begin, end) must be one whole pending range, INTERNAL otherwise) bf16 of the
  // updated master too, element begin at bf16_out[0]. Returns whether it wrote bf16_out; a
  // range runs once.
  absl::StatusOr<bool> RunPending(int u, size_t begin, size_t end, bf16* bf16_out,
                                  cudaStream_t stream);

  // On `stream`: the pending updates of the units whose gradients lie under the gathered
  // head, which must run before the head is gathered over them.
  absl::Status RunPendingUnderHead(cudaStream_t stream);

  // Every pending update on compute, then the host waits for compute: the kept state is the
  // step's. What reads or replaces the state between steps (snapshots, GatherUnit) calls it.
  absl::Status Flush();

  // A restore replaced unit u's state: its pending update, if any, no longer applies.
  void Drop(int u);

 private:
  explicit ZeroCudaOptimizer(const Config& config);
  bool any_offloaded() const { return config_.first_offloaded < config_.layout->num_units(); }
  // AdamW over elements [begin, end) of unit u's shard on `stream` (bf16 of the new master
  // at bf16_out[0] on, when not null).
  absl::Status UpdateShardRange(int u, size_t begin, size_t end, bf16* bf16_out,
                                int64_t adamw_step, const engine::AdamWConfig& adamw,
                                cudaStream_t stream) const;
  // AdamW on the GPU for units [0, first_offloaded), enqueued on compute.
  absl::Status DeviceStep(int64_t adamw_step, const engine::AdamWConfig& adamw) const;
  // Optimizer offload's step (Step, offloaded).
  absl::Status HostStep(int64_t adamw_step, const engine::AdamWConfig& adamw);
  // update_in_next_forward: records the step for every unit's shard (Step, deferred).
  absl::Status RecordPending(int64_t adamw_step, const engine::AdamWConfig& adamw);

  const Config config_;
  const int host_threads_;  // the host AdamW's: every core
  // update_in_next_forward: the last Step's update, not yet enqueued for the shard ranges in
  // `ranges[u]` (unit 0 of a split head: its input and output pieces' parts of the shard,
  // each run as its piece is gathered; every other unit: the shard).
  struct PendingUpdate {
    int64_t adamw_step = 0;
    engine::AdamWConfig adamw;
    std::vector<std::vector<std::pair<size_t, size_t>>> ranges;
    bool any() const;
  };
  PendingUpdate pending_;
  // Units whose shard gradient lies under the gathered head (both over spent activations).
  std::vector<int> under_head_work_;
  // Offload: the events that say each staging pair (Config) is free again.
  cudaEvent_t grads_copied_[2] = {nullptr, nullptr};
  cudaEvent_t weights_copied_[2] = {nullptr, nullptr};
};

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_CUDA_OPTIMIZER_H_
