// Llama on the CPU (layout and rotary convention: engine/llama/llama_arch.h), the math of
// Hugging Face's LlamaForCausalLM with eager attention, and of its relatives the config's
// family names (Qwen2's q/k/v biases, Qwen3's q/k head norms, Mistral's sliding window).
// LlamaModel<T> is the model over the CPU ops, templated on the element type: LlamaModel<float> is
// the engine behind LlamaCpu, the CpuModel the ZeRO engine drives; LlamaModel<double> exists for
// tight whole-model gradient checks. Both keep CpuModel's contract (engine/cpu/model.h):
// activations owned, parameters and gradients not; every backward ACCUMULATES (+=) into the unit's
// gradient buffer. With a tied head the LM head reads `embed` and its gradient accumulates into
// embed's.
//
// Activation checkpointing, as in gpt2_model.h (engine/checkpointing.h, model_core.h's
// ActKind). Per position of the (max_B, max_T) micro-batch, in elements (C hidden, Q = NH D,
// QKV = (NH + 2 NKV) D, I the SwiGLU width, L layers): the residual stream, C for each of the
// L + 1 block boundaries, is kept at every level (block l's input is residual l). A block's
// other activations are
//   kSaved  QKV + C + 2I + 2   qkv AFTER rotary (what attention and its backward read: rotary
//                              is cheap, but keeping its output leaves one qkv buffer and no
//                              second rotation), the mid-block residual C, gate | up 2I, the
//                              two RMSNorms' reciprocal rms (1 + 1); Qwen3 also keeps q and k
//                              before their head norms and those norms' reciprocal rms,
//                              (NH + NKV)(D + 1);
//   kCheap  2C + Q + I + NH max_T   the two RMSNorm outputs C + C, attention's output Q,
//                              SwiGLU's output I, and attention's softmax (B, NH, T, T).
// The softmax is recomputed at kSelective from the kept qkv by re-running the attention
// forward (the CPU attention keeps no separate per-row statistics). kNone keeps both kinds per
// layer; kSelective keeps kSaved per layer and one shared kCheap set; kFull one shared set of
// both. Against kNone, kSelective so saves (L - 1)(2C + Q + I + NH max_T) elements per
// position and kFull (L - 1)(3C + QKV + Q + 3I + 2 + NH max_T). The recomputation re-runs the
// forward's own calls on the same inputs (LlamaModel::RunBlock), so losses and gradients are
// bit-identical at every level.
#ifndef WEFT_WORKER_ENGINE_CPU_LLAMA_MODEL_H_
#define WEFT_WORKER_ENGINE_CPU_LLAMA_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/engine/cpu/model_adapter.h"
#include "worker/engine/cpu/model_core.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine::cpu {

template <typename T>
class LlamaModel : public CpuModelBase<T> {
 public:
  // Aborts on a config LlamaConfigProblems refuses (specs are validated long before).
  LlamaModel(const LlamaConfig& config, int max_b, int max_t, Checkpointing level)
      : LlamaModel(config, max_b, max_t, level, /*allocate=*/true) {}

  // ActivationBytes() of the model these arguments would build, counted without allocating
  // its arena (what the memory plan reads).
  static size_t PlannedActivationBytes(const LlamaConfig& config, int max_b, int max_t,
                                       Checkpointing level) {
    return LlamaModel(config, max_b, max_t, level, /*allocate=*/false).ActivationBytes();
  }

  const LlamaConfig& config() const { return config_; }

  // The embed rows of the tokens; positions enter only through rotary, inside attention.
  void EncoderForward(const T* head, const int32_t* tokens);
  void BlockForward(int layer, const T* block);
  // Final RMSNorm, LM head, loss: the mean loss in double (0 for inference, targets nullptr).
  double ClassifierForward(const T* head, const int32_t* targets, T loss_scale);

  // With a tied head, both the LM head's and the encoder's gradient land in embed's rows.
  void ClassifierBackward(const T* head, T* head_grad);
  void BlockBackward(int layer, const T* block, T* block_grad);
  void EncoderBackward(T* head_grad);

 private:
  // What a block's backward reads from its forward; the ActKind of each is in the constructor.
  struct BlockActs {
    T* norm1;    // (B, T, C) attention RMSNorm output
    T* rrms1;    // (B, T)
    T* qkv;      // (B, T, QKV) after rotary (what attention read)
    T* qk_raw;   // (B, T, (NH + NKV) D) Qwen3: q, k before their head norms (else empty)
    T* qk_rrms;  // (B, T, NH + NKV) Qwen3: the head norms' reciprocal rms
    T* atty;     // (B, T, Q) attention output before the projection
    T* att;      // (B, NH, T, T) softmax
    T* res2;     // (B, T, C) residual stream after the attention branch
    T* norm2;    // (B, T, C)
    T* rrms2;    // (B, T)
    T* gate_up;  // (B, T, 2I) gate | up
    T* swiglu;   // (B, T, I)
  };

  // Without `allocate`, only counts the arena: the model is for ActivationBytes() alone.
  LlamaModel(const LlamaConfig& config, int max_b, int max_t, Checkpointing level, bool allocate);

  // Block `layer`'s forward into acts_[layer]. With `recompute` (the start of its backward),
  // only the ops whose outputs the level does not keep per layer, and never the block's output.
  void RunBlock(int layer, const T* block, bool recompute);

  // Where the LM head's weight is in the head unit: lm_head, or embed when tied.
  size_t LmHeadOffset() const;

  std::vector<size_t> head_offsets_;
  LlamaBlockOffsets block_offsets_;  // kLlamaAbsent for tensors the family lacks

  LlamaConfig config_;
  using CpuModelBase<T>::mb_;
  using CpuModelBase<T>::arena_;
  using CpuModelBase<T>::logits_;
  using CpuModelBase<T>::losses_;
  // residual_[l] is the input of block l; residual_[L] feeds the final RMSNorm.
  std::vector<T*> residual_;  // L + 1 of (B, T, C)
  std::vector<BlockActs> acts_;
  T* rope_cos_;    // (maxT, D/2)
  T* rope_sin_;    // (maxT, D/2)
  T* normf_;       // (B, T, C)
  T* normf_rrms_;  // (B, T)
  // Scratch shared by all blocks (one block at a time).
  T* proj_;      // (B, T, C) a projection into the residual stream
  T* dres_;      // (B, T, C) gradient of the residual stream, flowing down through the blocks
  T* dnorm_;     // (B, T, C) gradient of an RMSNorm output
  T* datty_;     // (B, T, Q)
  T* dqkv_;      // (B, T, QKV)
  T* dswiglu_;   // (B, T, I)
  T* dgate_up_;  // (B, T, 2I)
  T* datt_;      // (T, T) attention backward scratch
};

extern template class LlamaModel<float>;
extern template class LlamaModel<double>;

}  // namespace weft::engine::cpu

namespace weft::engine {

// Llama in fp32: the CpuModel of LlamaArch (CreateCpuModel), also built directly from a config
// by tests.
class LlamaCpu final : public cpu::FloatCpuModel<cpu::LlamaModel<float>> {
 public:
  using FloatCpuModel::FloatCpuModel;
};

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_CPU_LLAMA_MODEL_H_
