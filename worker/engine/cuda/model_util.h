// What the per-architecture CUDA models (gpt2_model.cc, llama_model.cc) share: ArenaModel, the
// CudaModel base that owns the one allocation of activations (carved by the model's measuring
// Layout), the GEMM library, the batch upload and the chunked LM head with its loss.
#ifndef WEFT_WORKER_ENGINE_CUDA_MODEL_UTIL_H_
#define WEFT_WORKER_ENGINE_CUDA_MODEL_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/cuda/fp8_linear.h"
#include "worker/engine/cuda/matmul.h"
#include "worker/engine/cuda/model.h"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {

// Carves typed, 256-byte aligned pieces out of one allocation; with a null base it only
// measures, so a model's plan and its allocation share one layout function.
class Arena {
 public:
  explicit Arena(char* base) : base_(base) {}
  template <typename T>
  T* Take(size_t count) {
    offset_ = NextOffset();
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += count * sizeof(T);
    return p;
  }
  // `count` of its own when `keep`, else `shared` (a buffer every layer reuses: activation
  // checkpointing's recompute target).
  template <typename T>
  T* TakeOr(bool keep, T* shared, size_t count) {
    return keep ? Take<T>(count) : shared;
  }
  size_t size() const { return offset_; }
  // Moves the end to `offset` when that lies past it: bytes placed by offset (At) rather than
  // taken.
  void ExtendTo(size_t offset) { offset_ = std::max(offset_, offset); }
  // Where the next Take starts: the end so far, aligned to 256 bytes.
  size_t NextOffset() const { return (offset_ + 255) / 256 * 256; }
  // Where bytes [offset, ...) of the arena are (null when only measuring).
  char* At(size_t offset) const { return base_ == nullptr ? nullptr : base_ + offset; }

 private:
  char* base_;
  size_t offset_ = 0;
};

class ArenaModel : public CudaModel {
 public:
  ~ArenaModel() override;
  ArenaModel(const ArenaModel&) = delete;
  ArenaModel& operator=(const ArenaModel&) = delete;

  int b() const override { return b_; }
  int t() const override { return t_; }
  absl::Status SetBatch(int b, int t, const int32_t* inputs, const int32_t* targets,
                        const int32_t* doc_starts, bool reset_positions) override;
  const float* Losses() const override { return losses_; }
  size_t ActivationBytes() const override { return arena_bytes_; }
  size_t BlasWorkspaceBytes() const override { return BlasOptions{}.workspace_bytes; }
  float* SpentActivationGradient(int layer) const override {
    return layer < static_cast<int>(spent_grads_.size()) ? spent_grads_[layer] : nullptr;
  }
  bf16* HeadWork() const override { return head_work_; }
  Fp8CastCounts* Fp8Counts() const override {
    return fp8_ == nullptr ? nullptr : fp8_scratch_.counts;
  }

 protected:
  ArenaModel(int max_b, int max_t, CheckpointingPlan level, cudaStream_t stream,
             ArenaRequests requests)
      : max_b_(max_b),
        max_t_(max_t),
        level_(level),
        stream_(stream),
        requests_(std::move(requests)) {}

  // Points every buffer into the allocation at `base` and returns the bytes used; a null base
  // only measures. Implementations take their buffers and TakeCommon's.
  virtual size_t Layout(char* base) = 0;
  // Bytes [begin, end) of the arena that nothing reads or writes while Classifier runs: the
  // activations a checkpointing level shares between blocks, which the last block's forward
  // has been the last to use and its backward recomputes after the classifier.
  struct ClassifierSpare {
    size_t begin = 0;
    size_t end = 0;
  };
  // The buffers of this class: the engine's HeadWork, losses, tokens, targets (N = max_b *
  // max_t each), the logits chunk for a padded vocabulary of vp (inside `spare` when it fits
  // there), and the embedding backward's plan and scratch at width c. Called after
  // PlaceSpentActivationGradients, whose room it uses (TakeBeforeBackward).
  void TakeCommon(Arena& arena, int vp, int c, ClassifierSpare spare);
  // Places the spent-activation gradients (CudaModel::SpentActivationGradient) over the
  // per-layer buffers just taken. `layer_ends[l]`: the arena offset where layer l's buffers
  // (its residual-stream entry and what its level keeps) end; the layers' buffers lie in layer
  // order and nothing else lies among them, and the last layer's output entry is taken just
  // before this. Gradient l starts at or past layer_ends[l] and past gradient l - 1; the arena
  // is extended to the last one's end where that lies further. What the gradients reach past
  // the output entry is room for TakeBeforeBackward.
  void PlaceSpentActivationGradients(Arena& arena, const std::vector<size_t>& layer_ends);
  // `count` Ts for a buffer nothing touches once Classifier has returned (it is dead before
  // the first BlockBackward): inside the gradients placed over spent activations, past every
  // activation, when there is room left there (none is written before BlockBackward(L - 1));
  // else taken from the arena.
  template <typename T>
  T* TakeBeforeBackward(Arena& arena, size_t count) {
    const size_t begin = (room_.begin + 255) / 256 * 256;
    if (begin + count * sizeof(T) > room_.end) return arena.Take<T>(count);
    room_.begin = begin + count * sizeof(T);
    return reinterpret_cast<T*>(arena.At(begin));
  }
  // Layout from an empty room.
  size_t RunLayout(char* base) {
    room_ = {};
    return Layout(base);
  }
  // Creates the GEMM library and allocates Layout's bytes (RESOURCE_EXHAUSTED naming the need
  // and the free memory), then lays the buffers out in them.
  absl::Status Allocate();
  // With requests_.fp8_linears, the FP8 Linears' cast scratch for layers of up to max_b * max_t
  // rows, max_width features in or out and max_weight weight elements, and kept_bytes for the
  // casts a recomputation keeps for the backward (Fp8Linears::StartKeeping; room for each
  // tensor by Fp8LinearScratch::KeptBytes). A Layout takes it; without FP8 it takes nothing.
  void TakeFp8Scratch(Arena& arena, int max_width, size_t max_weight, size_t kept_bytes);
  // A block's Linear layer in the model's precision (bf16 through blas_, or FP8):
  //   out (N, OC) = inp (N, C) @ weight (OC, C)^T (+ bias) (+ residual; it may be out).
  absl::Status Linear(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                      const bf16* residual, int n, int c, int oc);
  //   dweight (OC, C) (+)= dout^T @ inp (= when !accumulate), then dinp (N, C) = dout @ weight;
  //   dinp may be inp (the weight gradient reads it first).
  absl::Status LinearBackward(bf16* dinp, float* dweight, bool accumulate, const bf16* dout,
                              const bf16* inp, const bf16* weight, int n, int c, int oc);
  // The same around a GELU (GPT-2's fc and fcproj), in the model's precision: bf16 fuses the
  // GELU and its backward into the GEMMs' epilogues, FP8 runs them as kernels apart.
  //   pre (N, OC) = inp (N, C) @ weight (OC, C)^T + bias;  out (N, OC) = gelu(pre)
  absl::Status LinearGelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight,
                          const bf16* bias, int n, int c, int oc);
  //   for out = act @ weight^T with act = gelu(pre) (N, C): dweight (OC, C) (+)= dout^T @ act,
  //   then dpre (N, C) = gelu'(pre) * (dout @ weight); dpre may be act (read first), not pre.
  absl::Status LinearBackwardGelu(bf16* dpre, float* dweight, bool accumulate, const bf16* dout,
                                  const bf16* act, const bf16* pre, const bf16* weight, int n,
                                  int c, int oc);
  // Bytes of Layout plus the GEMM workspace: the plan of an instance never allocated.
  size_t PlannedBytes() { return RunLayout(nullptr) + BlasOptions{}.workspace_bytes; }

  // Activation checkpointing (engine/checkpointing.h): what BlockBackward(l) runs first to
  // bring back what level_.At(l) did not keep of block l's forward — nothing at kNone; at kFull
  // the block's forward up to the MLP's activation (its two halves below); at kSelective the
  // model's RecomputeSelective. In FP8 the Linear layers it runs keep their casts for the
  // backward that follows (Fp8Linears::StartKeeping).
  absl::Status RecomputeBlock(int l, const bf16* block) override;
  // The forward's halves: the attention sub-layer (block input -> mid-block residual) and the
  // MLP up to its activation function's output; BlockForward adds the down projection and the
  // residual.
  virtual absl::Status AttentionForward(int l, const bf16* block) = 0;
  virtual absl::Status MlpForwardToActivation(int l, const bf16* block) = 0;
  // SELECTIVE's recomputation from the kept block input and matmul outputs.
  virtual absl::Status RecomputeSelective(int l, const bf16* block) = 0;

  // The LM head and its loss over the N = b * t rows of normed (N, C), by row chunks so the
  // (N, Vp) logits never exist at once: logits = normed weight^T (weight (Vp, C)), the fused
  // softmax cross-entropy over the first v columns into losses_ and, with dweight, the
  // backward: dnormed (N, C) written, dweight (Vp, C) += (grad_scale as in CudaModel).
  absl::Status LmHeadLoss(const bf16* normed, const bf16* weight, float* dweight, bf16* dnormed,
                          int c, int v, int vp, float grad_scale);

  const int max_b_, max_t_;
  const CheckpointingPlan level_;
  cudaStream_t stream_;
  const ArenaRequests requests_;
  std::vector<float*> spent_grads_;
  int b_ = 0, t_ = 0;
  std::unique_ptr<Blas> blas_;
  int32_t* tokens_ = nullptr;   // (B, T) on the device
  int32_t* targets_ = nullptr;  // (B, T)
  // The batch's documents for the attention kernels, or null (SetBatch without them).
  const int32_t* DocStarts() const { return has_documents_ ? doc_starts_ : nullptr; }
  // Positions within documents for rotary / position embeddings, or null (0..T-1).
  const int32_t* Positions() const { return reset_positions_ ? positions_ : nullptr; }
  // The embedding backward's order for this batch (SetBatch builds it from the host's tokens),
  // its copy on the device and the scratch its split tokens sum into.
  EmbeddingGradPlan embedding_plan_;
  int32_t* embedding_plan_device_ = nullptr;
  float* embedding_scratch_ = nullptr;

 private:
  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  // What of the spent-activation gradients is free until the backward: [begin, end).
  struct Room {
    size_t begin = 0;
    size_t end = 0;
  };
  Room room_;
  bf16* head_work_ = nullptr;
  float* losses_ = nullptr;  // (B, T)
  int32_t* doc_starts_ = nullptr;  // (B, T) on the device
  int32_t* positions_ = nullptr;   // (B, T)
  bool has_documents_ = false;
  bool reset_positions_ = false;
  // Pageable is enough: SetBatch's copies return once the data is staged.
  std::vector<int32_t> host_positions_;
  int vp_ = 0;
  bf16* logits_ = nullptr;   // (logit_rows_, Vp)
  int logit_rows_ = 0;
  Fp8LinearScratch fp8_scratch_;
  std::unique_ptr<Fp8Linears> fp8_;  // with requests_.fp8_linears, once allocated
};

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_MODEL_UTIL_H_
