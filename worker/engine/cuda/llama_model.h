// Llama on one GPU in mixed precision, unit by unit: the CudaModel (engine/cuda/model.h) of
// LlamaArch (layout and rotary convention: engine/llama/llama_arch.h), the CUDA twin of the CPU
// Llama model (engine/cpu/llama_model.h), with the family's differences: Qwen2's q/k/v biases
// in the qkv GEMM's epilogue, Qwen3's head norms on q and k in place before rotary (their input
// kept with qkv, (NH + NKV) D more a position wherever qkv is kept), Mistral's window in the
// flash kernels.
//
// Precision: parameters arrive as bf16 units; activations are bf16; RMSNorm statistics,
// attention log-sum-exps, the rotary tables, losses and every parameter gradient are fp32. GEMMs
// are cuBLASLt bf16 with fp32 accumulation, or for the blocks' Linear layers FP8 when created
// with ArenaRequests::fp8_linears (precision FP8: ArenaModel::Linear, fp8_linear.h); one GEMM
// for q, k, v (the fused qkvw) and one for gate and up (the fused gate_up).
//
// A block: x -> RMSNorm -> qkv (B, T, (NH + 2 NKV) D) -> rotary on q, k in place -> grouped-
// query flash attention reading the shared k/v heads in place -> o_proj -> + x -> RMSNorm ->
// gate_up (B, T, 2I) -> SwiGLU (B, T, I) -> down -> + residual. The head: token embedding (no
// positions); final RMSNorm, LM head (lm_head, or embed when tied) and cross-entropy over the
// first V of Vp columns, in row chunks so (B, T, Vp) never exists at once.
//
// Memory: activations are planned up front (PlanActivationBytes) and allocated in one piece.
// Per layer, bf16 per position, besides the fp32 row statistics (both rstd, attention's lse)
// which every level keeps:
//   kNone       the block input, both norms' outputs, qkv (after rotary), the attention
//               output, the mid-block residual, gate_up and the SwiGLU output:
//               5 C + (NH + 2 NKV) D + 3 I;
//   kSelective  the block input, qkv, the attention output and gate_up: 2 C + (NH + 2 NKV) D
//               + 2 I; the backward first recomputes both norms, the mid-block residual (the
//               attention's output projection, one C x C GEMM, plus the input) and SwiGLU.
//               Keeping attention's output rather than the residual costs the same bytes and
//               spares re-running attention: at the Llama-8B shape on an H200 the projection
//               is 0.3 ms where the flash forward is 1.0 ms;
//   kFull       the block input: C; the backward first re-runs the block's forward up to the
//               SwiGLU output (the down projection's output is not needed).
// What a level does not keep lives in one set of buffers the layers at that level share (a plan
// may run some blocks one level lighter: engine::CheckpointingPlan).
//
// Needs: hidden size, head size and intermediate size multiples of 8 (16-byte vectors), a head
// size flash attention supports that is a multiple of 16 (rotary halves as vectors), Vp % 8.
#ifndef WEFT_WORKER_ENGINE_CUDA_LLAMA_MODEL_H_
#define WEFT_WORKER_ENGINE_CUDA_LLAMA_MODEL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/cuda/model_util.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine::cuda {

class LlamaCuda final : public ArenaModel {
 public:
  // INVALID_ARGUMENT for shapes the kernels cannot take (see above), RESOURCE_EXHAUSTED when
  // the activations do not fit; kernels go to `stream` (not owned), on the current device.
  // requests: CreateCudaModel's (engine/cuda/model.h).
  static absl::StatusOr<std::unique_ptr<LlamaCuda>> Create(
      const LlamaConfig& config, int max_b, int max_t, CheckpointingPlan level,
      cudaStream_t stream, const ArenaRequests& requests = {});
  // What Create allocates: activations, scratch and the GEMM workspace (exact).
  static size_t PlanActivationBytes(const LlamaConfig& config, int max_b, int max_t,
                                    CheckpointingPlan level,
                                    const ArenaRequests& requests = {});

  const LlamaConfig& config() const { return config_; }

  // CudaModel's passes over the head: the forward is the token embedding alone; Classifier
  // is the final RMSNorm, the LM head (lm_head, or embed when tied) and cross-entropy, and its
  // backward adds to the norm's and the LM head's gradients.
  absl::Status EncoderForward(const bf16* head) override;
  absl::Status Classifier(const bf16* head, float grad_scale, float* head_grad) override;
  absl::Status EncoderBackward(float* head_grad) override;
  // Over block `layer` (unit 1 + layer).
  absl::Status BlockForward(int layer, const bf16* block) override;
  absl::Status BlockBackwardRecomputed(int layer, const bf16* block, float* block_grad,
                                       GradWrite write) override;

 private:
  LlamaCuda(const LlamaConfig& config, int max_b, int max_t, CheckpointingPlan level,
            cudaStream_t stream, ArenaRequests requests);
  size_t Layout(char* base) override;
  // The forward's halves: the attention sub-layer (x -> res2), and the MLP up to the SwiGLU
  // output (res2 -> act); BlockForward adds the down projection and the residual.
  absl::Status AttentionForward(int l, const bf16* block) override;
  absl::Status MlpForwardToActivation(int l, const bf16* block) override;
  absl::Status RecomputeSelective(int l, const bf16* block) override;
  // The rotary tables from RopeInverseFrequencies (once, at creation).
  absl::Status BuildRopeTables();
  // The attention half of BlockBackward: dres_ (the gradient at the mid-block residual) gets
  // the attention sub-layer's input gradient added. Scratch: dqkv (B, T, (NH + 2 NKV) D) and
  // dx (B, T, C).
  absl::Status AttentionBackward(int l, const bf16* block, float* block_grad, bool accumulate,
                                 bf16* dqkv, bf16* dx);

  const LlamaConfig config_;
  std::vector<TensorInfo> head_tensors_;
  LlamaBlockOffsets block_offsets_;  // kLlamaAbsent for the tensors the family lacks
  size_t head_output_begin_ = 0;  // LlamaArch::HeadOutputBegin: where Classifier's head starts
  // What a block's forward keeps for its backward.
  struct Saved {
    bf16* attn_norm;   // (B, T, C)
    float* attn_rstd;  // (B, T)
    bf16* qkv;         // (B, T, (NH + 2 NKV) D), q and k rotated: flash attention's input
    bf16* qk_raw;      // (B, T, (NH + NKV) D) Qwen3: q, k before the head norms (else null)
    float* lse;        // (B * NH * T)
    bf16* atty;        // (B, T, Q) attention output
    bf16* res2;        // (B, T, C) the mid-block residual stream
    bf16* mlp_norm;    // (B, T, C)
    float* mlp_rstd;   // (B, T)
    bf16* gate_up;     // (B, T, 2I); its gradient in the backward, then dqkv
    bf16* act;         // (B, T, I) SwiGLU output; its gradient in the backward, then dx
  };
  std::vector<Saved> saved_;  // per layer
  // The residual stream, L + 1 entries: res_[l] is block l's input, res_[L] the last output.
  std::vector<bf16*> res_;
  // The classifier's: the final norm's output, statistics and input gradient (B, T, C).
  bf16* final_norm_ = nullptr;
  float* final_rstd_ = nullptr;
  bf16* dfinal_norm_ = nullptr;
  // Scratch shared by the layers: dres_ (B, T, C), the residual stream's gradient. (A block's
  // other products land in place: BlockForward, BlockBackwardRecomputed.)
  bf16* dres_ = nullptr;
  // RmsNormBackwardScratchFloats, and BiasBackwardScratchFloats or
  // QkNormBackwardScratchFloats for the families that need them.
  float* reduce_scratch_ = nullptr;
  float* flash_scratch_ = nullptr;  // FlashAttentionBackwardScratchFloats
  float* rope_cos_ = nullptr;       // (maxT, D/2)
  float* rope_sin_ = nullptr;       // (maxT, D/2)
  float* inv_freq_ = nullptr;       // (D/2)
};

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_LLAMA_MODEL_H_
