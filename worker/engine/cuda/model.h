// What the GPU ZeRO-3 engine (worker/zero/zero_cuda.h) drives: one architecture's model on one GPU
// in mixed precision, unit by unit (unit 0 the head, unit 1 + l block l: see
// engine/model_arch.h), with the CPU model's unit layout so the two share checkpoints and
// initialisation. Implemented per architecture (engine/cuda/gpt2_model.h for GPT-2) and created
// by CreateCudaModel, the GPU's one registration point.
//
// Precision: parameters arrive as bf16 units (the gathered working copies); every parameter
// gradient is an fp32 unit.
//
// A training micro-step, every backward ACCUMULATING (+=) into fp32 gradient units, except
// BlockBackward told GradWrite::kOverwrite:
//   model.SetBatch(b, t, inputs, targets, doc_starts, reset_positions);  // host (B, T) int32s
//   model.EncoderForward(head);
//   for l = 0 .. L-1: model.BlockForward(l, block[l]);
//   model.Classifier(head, grad_scale, head_grad);   // forward AND backward, fused
//   for l = L-1 .. 0: model.BlockBackward(l, block[l], block_grad[l], write);
//   model.EncoderBackward(head_grad);
// Everything is enqueued on the stream given at creation; nothing synchronises the host.
//
// Activation checkpointing (engine/checkpointing.h): a model created at kSelective or kFull
// keeps less per block and BlockBackward recomputes the rest first, into buffers all blocks
// share. BlockBackward(l) therefore needs block l's parameters exactly as its forward had them
// (the ZeRO engine's gathered unit) and the residual stream's entry to block l untouched since
// BlockForward(l).
#ifndef WEFT_WORKER_ENGINE_CUDA_MODEL_H_
#define WEFT_WORKER_ENGINE_CUDA_MODEL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/checkpointing.h"
#include "worker/engine/cuda/fp8.h"
#include "worker/engine/cuda/plan_sizes.h"
#include "worker/engine/model_arch.h"

namespace weft::engine::cuda {

// How BlockBackward stores a block's parameter gradients. kOverwrite writes them (=) and
// ignores what the gradient unit held, which spares the caller a memset and the GEMMs a read
// of the old values; the unit's padding past its tensors is left as it is.
enum class GradWrite { kAccumulate, kOverwrite };

class CudaModel {
 public:
  using bf16 = __nv_bfloat16;

  virtual ~CudaModel() = default;

  virtual int b() const = 0;
  virtual int t() const = 0;

  // Sets the micro-batch's shape ([1, max_B] x [1, max_T], else INVALID_ARGUMENT) and copies
  // its tokens (host (B, T) int32; targets may be null for no loss; a negative target is
  // ignored, Hugging Face's labels = -100) to the GPU. doc_starts (host (B, T), or null: one
  // document a row) packs documents as engine/cpu/model.h's SetDocuments says: attention stays
  // within each, and with reset_positions positions count from each one's start; one that does
  // not segment its row is INVALID_ARGUMENT. The host buffers may be reused as soon as this
  // returns.
  virtual absl::Status SetBatch(int b, int t, const int32_t* inputs, const int32_t* targets,
                                const int32_t* doc_starts, bool reset_positions) = 0;

  // Forward, unit by unit: `head` is unit 0, `block` unit 1 + layer (bf16, UnitSize elements).
  // Only the elements an op reads need to be there: EncoderForward and EncoderBackward read
  // and write unit 0 below ModelArch::HeadOutputBegin() only.
  virtual absl::Status EncoderForward(const bf16* head) = 0;
  virtual absl::Status BlockForward(int layer, const bf16* block) = 0;
  // Final norm, LM head and cross-entropy over the B*T positions (per-position losses in
  // Losses()). With head_grad, also the backward of all three: gradients of
  // grad_scale * sum of losses accumulate into head_grad, and the residual stream's gradient
  // is prepared for BlockBackward. Needs targets. `head` and `head_grad` point at unit 0's
  // element ModelArch::HeadOutputBegin() (its start for a tied head), so that an engine may
  // hold only that part of the unit.
  virtual absl::Status Classifier(const bf16* head, float grad_scale, float* head_grad) = 0;
  // (B, T) fp32, device memory, valid after Classifier until the next Classifier.
  virtual const float* Losses() const = 0;

  // Backward, in reverse order, into the fp32 gradient units: BlockBackward as `write` says,
  // EncoderBackward always ACCUMULATING (+=).
  // BlockBackward is RecomputeBlock then BlockBackwardRecomputed. A caller that may write
  // block_grad only later (the ZeRO engine, while that buffer is still being reduced) calls the
  // two apart and waits in between: RecomputeBlock brings back what activation checkpointing
  // did not keep of the block's forward (nothing at kNone) and touches no gradient.
  absl::Status BlockBackward(int layer, const bf16* block, float* block_grad, GradWrite write) {
    if (absl::Status s = RecomputeBlock(layer, block); !s.ok()) return s;
    return BlockBackwardRecomputed(layer, block, block_grad, write);
  }
  virtual absl::Status RecomputeBlock(int layer, const bf16* block) = 0;
  virtual absl::Status BlockBackwardRecomputed(int layer, const bf16* block, float* block_grad,
                                               GradWrite write) = 0;
  virtual absl::Status EncoderBackward(float* head_grad) = 0;

  // Device bytes of activations and scratch, and of the GEMM library's workspace.
  virtual size_t ActivationBytes() const = 0;
  virtual size_t BlasWorkspaceBytes() const = 0;

  // Where block `layer`'s gradient may live when the model was created with spent_grad_bytes
  // (null otherwise): fp32 memory of that many bytes inside the activations, over what blocks
  // `layer` + 1 and later keep (and the residual stream's entries past `layer`). Their forward
  // writes it and the backward reads it until BlockBackward(layer + 1) is done; nothing in a
  // backward touches it from BlockBackward(layer) on. So such a gradient may be written only
  // by or after BlockBackward(layer), and the next forward writes over it: it serves a step
  // without gradient accumulation, read by the optimizer before then. Of what a forward writes
  // before BlockForward(layer), only HeadWork may lie over it.
  virtual float* SpentActivationGradient(int layer) const = 0;

  // The ArenaRequests::head_work_elements bf16 elements the engine gathers the head into (null
  // for none): EncoderForward's and Classifier's `head`. Read by nothing else, and valid from
  // a micro-step's start until its Classifier returns: with spent-activation gradients it may
  // lie over gradients not written by then (past every activation the forward keeps), so it
  // holds garbage once the first BlockBackward has run, and may be written (gathered into)
  // only once the gradients of the step before have been read, as the forward's activations.
  virtual bf16* HeadWork() const = 0;

  // With FP8 Linear layers (ArenaRequests::fp8_linears), what their casts did, on the device:
  // [0] E4M3 (inputs and weights), [1] E5M2 (output gradients), accumulating (+=) from zero at
  // creation; the caller reads and zeroes them on the model's stream (the ZeRO engine, each
  // step). Null without FP8.
  virtual Fp8CastCounts* Fp8Counts() const { return nullptr; }
};

// One architecture's CUDA model, found once by FindCudaModel, so that nothing after that can
// meet an architecture without one. Refers to the ModelArch it was found for, which must
// outlive it.
struct CudaModelEntry {
  // The model on the current device, kernels on `stream` (not owned), for micro-batches up to
  // (max_b, max_t), keeping what `level` says of each block. INVALID_ARGUMENT for shapes the
  // kernels cannot take; RESOURCE_EXHAUSTED when the activations do not fit. `requests`: what
  // the allocation holds for the engine besides.
  std::function<absl::StatusOr<std::unique_ptr<CudaModel>>(
      int max_b, int max_t, CheckpointingPlan level, cudaStream_t stream,
      const ArenaRequests& requests)>
      create;
  // Device bytes `create` allocates for activations, scratch and the GEMM workspace (exact,
  // for the memory planner), what `requests` asks for included. Touches no device.
  std::function<size_t(int max_b, int max_t, CheckpointingPlan level,
                       const ArenaRequests& requests)>
      activation_bytes;
};

// The CUDA model of `arch`: INVALID_ARGUMENT naming the architecture when none is registered
// (engine/cuda/model_factory.cc, the GPU's one registration point: a line per architecture).
absl::StatusOr<CudaModelEntry> FindCudaModel(const ModelArch& arch);

// FindCudaModel(arch)->create(max_b, max_t, level, stream, requests).
absl::StatusOr<std::unique_ptr<CudaModel>> CreateCudaModel(
    const ModelArch& arch, int max_b, int max_t, CheckpointingPlan level, cudaStream_t stream,
    const ArenaRequests& requests = {});
// FindCudaModel(arch)->activation_bytes(max_b, max_t, level, requests).
absl::StatusOr<size_t> PlanCudaActivationBytes(const ModelArch& arch, int max_b, int max_t,
                                               CheckpointingPlan level,
                                               const ArenaRequests& requests = {});

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_MODEL_H_
