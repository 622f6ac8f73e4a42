// GPT-2 on one GPU in mixed precision, unit by unit: the CudaModel (engine/cuda/model.h) of
// Gpt2Arch (layout: engine/gpt2/gpt2_arch.h), the CUDA twin of engine::GptCpu
// (engine/cpu/gpt2_model.h).
//
// Precision: parameters arrive as bf16 units (the gathered working copies); activations are
// bf16; LayerNorm statistics, attention log-sum-exps, losses and every parameter gradient are
// fp32. GEMMs are cuBLASLt/cuBLAS bf16 with fp32 accumulation. With ArenaRequests::fp8_linears
// the blocks' four Linear layers (q/k/v, attproj, fc, fcproj) run in FP8 instead (fp8_linear.h),
// their GELU then a kernel of its own rather than the fc GEMM's epilogue, forward and backward.
//
// The call order and the accumulate (+=) contract are CudaModel's.
//
// Memory: activations are planned up front from (config, max B, T, checkpointing level) —
// PlanActivationBytes — and allocated in one piece, so an impossible configuration fails before
// training starts. Per layer, in (B, T, C) bf16 units, besides the fp32 row statistics (both
// LayerNorms' mean and rstd, the softmax log-sum-exp) which every level keeps:
//   kNone       the block input, ln1, q/k/v, the attention output, the mid-block residual,
//               ln2 and the fc output before and after GELU: 16;
//   kSelective  the block input, q/k/v, the mid-block residual and the fc output before
//               GELU: 9; the backward first recomputes attention (from the kept q, k, v) and
//               GELU — the standalone GELU kernel, which equals the fc GEMM's fused GELU to
//               bf16 rounding, so this level matches kNone to bf16 rounding rather than bit for
//               bit;
//   kFull       the block input: 1; the backward first re-runs the block's forward up to the
//               GELU (bit for bit: the same kernels).
// What a level does not keep lives in one set of buffers the layers at that level share (a plan
// may run some blocks one level lighter: engine::CheckpointingPlan). The logits are
// processed in row chunks, so (B, T, Vp) never exists at once.
//
// LateNorms: below kNone, the LayerNorm outputs the backward reads as weight-gradient inputs
// (ln1 at both levels, ln2 at kSelective) are recomputed where they are read, over the fc
// output the backward has spent, rather than kept in buffers of their own from the block's
// recomputation on (bit for bit: the same kernel on the same kept input).
//
// Attention: fused flash attention (flash_attention.cu) when it supports the head size, so no
// (B, NH, T, T) buffer exists at all; otherwise cuBLAS batched GEMMs around the causal softmax
// kernels, with one shared (B, NH, T, T) scores buffer and one for its gradient.
#ifndef WEFT_WORKER_ENGINE_CUDA_GPT2_MODEL_H_
#define WEFT_WORKER_ENGINE_CUDA_GPT2_MODEL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/cuda/model_util.h"
#include "worker/engine/gpt2/gpt2_arch.h"

namespace weft::engine::cuda {

class GptCuda final : public ArenaModel {
 public:
  // Bytes Create allocates for activations and scratch (exact, for the memory planner).
  static size_t PlanActivationBytes(const GptConfig& config, int max_b, int max_t,
                                    CheckpointingPlan level,
                                    const ArenaRequests& requests = {});

  // On the current device; kernels go to `stream` (not owned). INVALID_ARGUMENT for shapes
  // the kernels cannot take (hidden size not a multiple of 8, ...), RESOURCE_EXHAUSTED when
  // the activations do not fit. requests: CreateCudaModel's (engine/cuda/model.h).
  static absl::StatusOr<std::unique_ptr<GptCuda>> Create(
      const GptConfig& config, int max_b, int max_t, CheckpointingPlan level,
      cudaStream_t stream, const ArenaRequests& requests = {});

  const GptConfig& config() const { return config_; }

  absl::Status EncoderForward(const bf16* head) override;
  absl::Status BlockForward(int layer, const bf16* block) override;
  // Final LayerNorm, tied LM head (wte) and cross-entropy; head_grad gets wte, lnfw, lnfb.
  absl::Status Classifier(const bf16* head, float grad_scale, float* head_grad) override;

  absl::Status BlockBackwardRecomputed(int layer, const bf16* block, float* block_grad,
                                       GradWrite write) override;
  absl::Status EncoderBackward(float* head_grad) override;

 private:
  GptCuda(const GptConfig& config, int max_b, int max_t, CheckpointingPlan level,
          cudaStream_t stream, ArenaRequests requests);
  size_t Layout(char* base) override;
  // The buffers that layers at the plan's heaviest level share instead of keeping their own
  // (null where every layer keeps its own).
  struct SharedActivations {
    bf16 *atty = nullptr, *ln2 = nullptr, *fcg = nullptr, *qkv = nullptr, *q = nullptr,
         *k = nullptr, *v = nullptr, *res2 = nullptr, *fch = nullptr;
  };
  // Layout's layer l: its residual-stream entry, then what its level keeps (or `shared`'s).
  void TakeLayer(Arena& a, int l, const SharedActivations& shared);
  // Layout's tail: the final norm's buffers (over what the backward frees), attention's
  // backward scratch and the reductions' scratch.
  void TakeBackwardBuffers(Arena& a);
  // The forward's pieces: the attention sub-layer (x -> res2), attention itself (q, k, v ->
  // atty), and the MLP up to the GELU output (res2 -> fcg); BlockForward adds fcproj and the
  // residual.
  absl::Status AttentionForward(int l, const bf16* block) override;
  absl::Status Attend(int l);
  absl::Status MlpForwardToActivation(int l, const bf16* block) override;
  absl::Status RecomputeSelective(int l, const bf16* block) override;
  // A sub-layer's LayerNorm -> Linear (C -> OC): its tensors in the block, the LayerNorm's
  // input (B, T, C) and row statistics (a late recompute writes them again, identically), and
  // its output when kept (null: LateNorms).
  struct NormLinear {
    int ln_weight, ln_bias, weight, bias;
    const bf16* input;
    float* mean;
    float* rstd;
    const bf16* kept;
  };
  // Its backward from dout (B, T, OC): the Linear's weight and bias gradients (the LayerNorm's
  // output recomputed over late_norm (B, T, C) first when not kept), its input gradient into dx
  // (B, T, C), then the LayerNorm's backward, adding to dres_ and the LayerNorm's gradients.
  absl::Status NormLinearBackward(const NormLinear& s, const bf16* dout, int oc,
                                  const bf16* block, float* block_grad, bool accumulate,
                                  bf16* late_norm, bf16* dx);

  const GptConfig config_;
  std::vector<TensorInfo> head_tensors_, block_tensors_;
  // Kept per layer l (index l), residual stream res has L + 1 entries.
  // fch: the fc layer's output before GELU, fcg: after (both kept: the GEMM epilogues read
  // them in the backward instead of a recomputing kernel). The backward writes the gradient of
  // fch over fcg once fcg is spent, and dqkv over that once it is spent in turn.
  std::vector<bf16*> res_, ln1_, q_, k_, v_, atty_, res2_, ln2_, fch_, fcg_;
  std::vector<float*> ln1_mean_, ln1_rstd_, ln2_mean_, ln2_rstd_, lse_;
  // q, k, v: flash path, the qkv projection's output (B, T, 3C) in layer_qkv_, which the
  // kernels read in place (q_, k_, v_ null); cuBLAS path, the (B, NH, T, HS) head copies in
  // q_, k_, v_ (layer_qkv_ null). The scratch y_, dq_, dk_, dv_ below exist only on the
  // cuBLAS path.
  std::vector<bf16*> layer_qkv_;
  // The classifier's: the final LayerNorm's output, statistics and input gradient (B, T, C).
  bf16* lnf_ = nullptr;
  float* lnf_mean_ = nullptr;
  float* lnf_rstd_ = nullptr;
  bf16* dlnf_ = nullptr;
  // Scratch shared by all layers: dres_ (B, T, C), the residual stream's gradient; the cuBLAS
  // path's forward qkv_ and attention buffers. (A block's other (B, T, C) products land in
  // place: BlockForward, BlockBackwardRecomputed.)
  bf16 *qkv_ = nullptr, *y_ = nullptr, *att_ = nullptr, *datt_ = nullptr, *dq_ = nullptr,
       *dk_ = nullptr, *dv_ = nullptr, *dres_ = nullptr;
  float* reduce_scratch_ = nullptr;
  // Flash attention for this head size (else the cuBLAS + softmax path and att_ / datt_).
  const bool flash_;
  float* flash_scratch_ = nullptr;  // FlashAttentionBackwardScratchFloats
};

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_GPT2_MODEL_H_
