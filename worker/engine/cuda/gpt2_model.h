// GPT-2 on one GPU in mixed precision, unit by unit: the CudaModel (engine/cuda/model.h) of
// Gpt2Arch (layout: engine/gpt2/gpt2_arch.h), the CUDA twin of engine::GptCpu
// (engine/cpu/gpt2_model.h).
//
// Precision: parameters arrive as bf16 units (the gathered working copies); activations are
// bf16; LayerNorm statistics, attention log-sum-exps, losses and every parameter gradient are
// fp32. GEMMs are cuBLASLt/cuBLAS bf16 with fp32 accumulation.
//
// The call order and the accumulate (+=) contract are CudaModel's.
//
// Memory: activations are planned up front from (config, max B, T) — PlanActivationBytes —
// and allocated in one piece, so an impossible configuration fails before training starts.
// Per layer it keeps ln1, q/k/v, the attention output, the mid-block residual, ln2 and the fc
// output before and after GELU (15 * B*T*C bf16) plus the per-row softmax log-sum-exp; the
// logits are processed in row chunks, so (B, T, Vp) never exists at once.
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
#include "worker/engine/cuda/matmul.h"
#include "worker/engine/cuda/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"

namespace weft::engine::cuda {

class GptCuda final : public CudaModel {
 public:
  // Bytes Create allocates for activations and scratch (exact, for the memory planner).
  static size_t PlanActivationBytes(const GptConfig& config, int max_b, int max_t);

  // On the current device; kernels go to `stream` (not owned). INVALID_ARGUMENT for shapes
  // the kernels cannot take (hidden size not a multiple of 8, ...), RESOURCE_EXHAUSTED when
  // the activations do not fit.
  static absl::StatusOr<std::unique_ptr<GptCuda>> Create(const GptConfig& config, int max_b,
                                                         int max_t, cudaStream_t stream);
  ~GptCuda() override;
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  const GptConfig& config() const { return config_; }
  int b() const override { return b_; }
  int t() const override { return t_; }

  absl::Status SetBatch(int b, int t, const int32_t* inputs, const int32_t* targets) override;

  absl::Status EncoderForward(const bf16* head) override;
  absl::Status BlockForward(int layer, const bf16* block) override;
  // Final LayerNorm, tied LM head (wte) and cross-entropy; head_grad gets wte, lnfw, lnfb.
  absl::Status Classifier(const bf16* head, float grad_scale, float* head_grad) override;
  const float* Losses() const override { return losses_; }

  absl::Status BlockBackward(int layer, const bf16* block, float* block_grad) override;
  absl::Status EncoderBackward(float* head_grad) override;

  size_t ActivationBytes() const override { return arena_bytes_; }
  size_t BlasWorkspaceBytes() const override { return BlasOptions{}.workspace_bytes; }

 private:
  GptCuda(const GptConfig& config, int max_b, int max_t, cudaStream_t stream);
  // Points every buffer into the allocation at `base` and returns the bytes used; a null base
  // only measures (the plan and the allocation share this one layout).
  size_t Layout(char* base);
  absl::Status Allocate();

  const GptConfig config_;
  const int max_b_, max_t_;
  cudaStream_t stream_;
  int b_ = 0, t_ = 0;
  std::unique_ptr<Blas> blas_;
  std::vector<TensorInfo> head_tensors_, block_tensors_;

  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  // Kept per layer l (index l), residual stream res has L + 1 entries.
  // fch: the fc layer's output before GELU, fcg: after (both kept: the GEMM epilogues read
  // them in the backward instead of a recomputing kernel).
  std::vector<bf16*> res_, ln1_, q_, k_, v_, atty_, res2_, ln2_, fch_, fcg_;
  std::vector<float*> ln1_mean_, ln1_rstd_, ln2_mean_, ln2_rstd_, lse_;
  // q, k, v: flash path, the qkv projection's output (B, T, 3C) in layer_qkv_, which the
  // kernels read in place (q_, k_, v_ null); cuBLAS path, the (B, NH, T, HS) head copies in
  // q_, k_, v_ (layer_qkv_ null). The scratch y_, dq_, dk_, dv_ below exist only on the
  // cuBLAS path.
  std::vector<bf16*> layer_qkv_;
  bf16* lnf_ = nullptr;
  float* lnf_mean_ = nullptr;
  float* lnf_rstd_ = nullptr;
  // Scratch shared by all layers.
  bf16 *qkv_ = nullptr, *y_ = nullptr, *att_ = nullptr, *datt_ = nullptr, *dq_ = nullptr,
       *dk_ = nullptr, *dv_ = nullptr, *dbig4_ = nullptr, *tmp_ = nullptr,
       *dres_ = nullptr, *dtmp_ = nullptr, *logits_ = nullptr;
  float* losses_ = nullptr;
  float* reduce_scratch_ = nullptr;
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;
  int logit_rows_ = 0;  // rows of the logits chunk
  // Flash attention for this head size (else the cuBLAS + softmax path and att_ / datt_).
  const bool flash_;
  float* flash_scratch_ = nullptr;  // FlashAttentionBackwardScratchFloats
};

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_GPT2_MODEL_H_
