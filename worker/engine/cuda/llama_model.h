// Llama on one GPU in mixed precision, unit by unit: the CudaModel (engine/cuda/model.h) of
// LlamaArch (layout and rotary convention: engine/llama/llama_arch.h), the CUDA twin of the CPU
// Llama model (engine/cpu/llama_model.h).
//
// Precision: parameters arrive as bf16 units; activations are bf16; RMSNorm statistics,
// attention log-sum-exps, the rotary tables, losses and every parameter gradient are fp32. GEMMs
// are cuBLASLt bf16 with fp32 accumulation; one GEMM for q, k, v (the fused qkvw) and one for
// gate and up (the fused gate_up).
//
// A block: x -> RMSNorm -> qkv (B, T, (NH + 2 NKV) D) -> rotary on q, k in place -> grouped-
// query flash attention reading the shared k/v heads in place -> o_proj -> + x -> RMSNorm ->
// gate_up (B, T, 2I) -> SwiGLU (B, T, I) -> down -> + residual. The head: token embedding (no
// positions); final RMSNorm, LM head (lm_head, or embed when tied) and cross-entropy over the
// first V of Vp columns, in row chunks so (B, T, Vp) never exists at once.
//
// Memory: activations are planned up front (PlanActivationBytes) and allocated in one piece.
// Per layer it keeps the block input, both norms' outputs and rstd, qkv (after rotary), the
// attention output, the mid-block residual, gate_up and the SwiGLU output, and the attention
// lse: (6 C + (NH + 2 NKV) D + 3 I) bf16 per position.
//
// Needs: hidden size, head size and intermediate size multiples of 8 (16-byte vectors), a head
// size flash attention supports that is a multiple of 16 (rotary halves as vectors), Vp % 8.
#ifndef WEFT_WORKER_ENGINE_CUDA_LLAMA_MODEL_H_
#define WEFT_WORKER_ENGINE_CUDA_LLAMA_MODEL_H_

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
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine::cuda {

class LlamaCuda final : public CudaModel {
 public:
  // Bytes Create allocates for activations, scratch and the GEMM workspace (exact).
  static size_t PlanActivationBytes(const LlamaConfig& config, int max_b, int max_t);

  // On the current device; kernels go to `stream` (not owned). INVALID_ARGUMENT for shapes the
  // kernels cannot take, RESOURCE_EXHAUSTED when the activations do not fit.
  static absl::StatusOr<std::unique_ptr<LlamaCuda>> Create(const LlamaConfig& config, int max_b,
                                                           int max_t, cudaStream_t stream);
  ~LlamaCuda() override;
  LlamaCuda(const LlamaCuda&) = delete;
  LlamaCuda& operator=(const LlamaCuda&) = delete;

  const LlamaConfig& config() const { return config_; }
  int b() const override { return b_; }
  int t() const override { return t_; }

  absl::Status SetBatch(int b, int t, const int32_t* inputs, const int32_t* targets) override;

  absl::Status EncoderForward(const bf16* head) override;
  absl::Status BlockForward(int layer, const bf16* block) override;
  // Final RMSNorm, LM head (lm_head, or embed when tied) and cross-entropy; head_grad gets the
  // norm's and the LM head's gradients.
  absl::Status Classifier(const bf16* head, float grad_scale, float* head_grad) override;
  const float* Losses() const override { return losses_; }

  absl::Status BlockBackward(int layer, const bf16* block, float* block_grad) override;
  absl::Status EncoderBackward(float* head_grad) override;

  size_t ActivationBytes() const override { return arena_bytes_; }
  size_t BlasWorkspaceBytes() const override { return BlasOptions{}.workspace_bytes; }

 private:
  LlamaCuda(const LlamaConfig& config, int max_b, int max_t, cudaStream_t stream);
  // Points every buffer into the allocation at `base` and returns the bytes used; a null base
  // only measures.
  size_t Layout(char* base);
  absl::Status Allocate();
  // The rotary tables from RopeInverseFrequencies (once, at creation).
  absl::Status BuildRopeTables();
  // The attention half of BlockBackward: dres_ (the gradient at the mid-block residual) gets
  // the attention sub-layer's input gradient added.
  absl::Status AttentionBackward(int l, const bf16* block, float* block_grad);

  const LlamaConfig config_;
  const int max_b_, max_t_;
  cudaStream_t stream_;
  int b_ = 0, t_ = 0;
  std::unique_ptr<Blas> blas_;
  std::vector<TensorInfo> head_tensors_, block_tensors_;

  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  // Per layer l; the residual stream res_ has L + 1 entries (res_[l] is block l's input).
  std::vector<bf16*> res_, attn_norm_, qkv_, atty_, res2_, mlp_norm_, gate_up_, act_;
  std::vector<float*> attn_rstd_, mlp_rstd_, lse_;
  bf16* final_norm_ = nullptr;
  float* final_rstd_ = nullptr;
  // Scratch shared by the layers: dqkv (B, T, (NH + 2 NKV) D), dgate_up (B, T, 2I), dact
  // (B, T, I), and (B, T, C) tmp_, dres_ (the residual stream's gradient), dtmp_.
  bf16 *dqkv_ = nullptr, *dgate_up_ = nullptr, *dact_ = nullptr, *tmp_ = nullptr,
       *dres_ = nullptr, *dtmp_ = nullptr, *logits_ = nullptr;
  float* losses_ = nullptr;
  float* norm_scratch_ = nullptr;   // RmsNormBackwardScratchFloats
  float* flash_scratch_ = nullptr;  // FlashAttentionBackwardScratchFloats
  float* rope_cos_ = nullptr;       // (maxT, D/2)
  float* rope_sin_ = nullptr;       // (maxT, D/2)
  float* inv_freq_ = nullptr;       // (D/2)
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;
  int logit_rows_ = 0;
};

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_LLAMA_MODEL_H_
