// GPT-2 on the CPU (layout: engine/gpt2/gpt2_arch.h). GptModel<T> is the model over the CPU
// ops, templated on the element type: GptModel<float> is the engine behind GptCpu, the
// CpuModel the ZeRO engine drives; GptModel<double> exists for tight whole-model gradient
// checks. Both keep CpuModel's contract (engine/cpu/model.h): activations owned, parameters and
// gradients not; every backward ACCUMULATES (+=) into the unit's gradient buffer.
//
// Activation checkpointing (engine/checkpointing.h, model_core.h's ActKind). Per position of
// the (max_B, max_T) micro-batch, in elements (C hidden, NH heads, L layers): the residual
// stream, C for each of the L + 1 block boundaries, is kept at every level (block l's input is
// residual l). A block's other activations are
//   kSaved  8C + 4          qkv 3C, the mid-block residual C, the fc output 4C, LayerNorm
//                           mean and rstd (2 + 2);
//   kCheap  7C + NH max_T   ln1 C, attention's output C, ln2 C, GELU's output 4C, and
//                           attention's softmax (B, NH, T, T), NH max_T per position.
// The softmax is the largest of them, and it is not a matmul output: at kSelective the
// backward recomputes it (and attention's output) from the kept qkv by re-running the
// attention forward, whose per-row max and sum are that recomputation's "saved statistics"
// (the CPU attention keeps no separate ones). kNone keeps both kinds per layer; kSelective
// keeps kSaved per layer and one shared kCheap set; kFull one shared set of both. Against
// kNone, kSelective so saves (L - 1)(7C + NH max_T) elements per position and kFull
// (L - 1)(15C + 4 + NH max_T). The recomputation re-runs the forward's own calls on the same
// inputs (GptModel::RunBlock), so losses and gradients are bit-identical at every level.
#ifndef WEFT_WORKER_ENGINE_CPU_GPT2_MODEL_H_
#define WEFT_WORKER_ENGINE_CPU_GPT2_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/engine/cpu/model_adapter.h"
#include "worker/engine/cpu/model_core.h"
#include "worker/engine/gpt2/gpt2_arch.h"

namespace weft::engine::cpu {

template <typename T>
class GptModel : public CpuModelBase<T> {
 public:
  GptModel(const GptConfig& config, int max_b, int max_t, Checkpointing level)
      : GptModel(config, max_b, max_t, level, /*allocate=*/true) {}

  // ActivationBytes() of the model these arguments would build, counted without allocating
  // its arena (what the memory plan reads).
  static size_t PlannedActivationBytes(const GptConfig& config, int max_b, int max_t,
                                       Checkpointing level) {
    return GptModel(config, max_b, max_t, level, /*allocate=*/false).ActivationBytes();
  }

  const GptConfig& config() const { return config_; }

  void EncoderForward(const T* head, const int32_t* tokens);
  void BlockForward(int layer, const T* block);
  // Returns the mean loss in double (0 for inference, targets == nullptr).
  double ClassifierForward(const T* head, const int32_t* targets, T loss_scale);
  void ClassifierBackward(const T* head, T* head_grad);
  void BlockBackward(int layer, const T* block, T* block_grad);
  void EncoderBackward(T* head_grad);

 private:
  // What a block's backward reads from its forward; the ActKind of each is in the constructor.
  struct BlockActs {
    T* ln1;       // (B, T, C)
    T* ln1_mean;  // (B, T)
    T* ln1_rstd;  // (B, T)
    T* qkv;       // (B, T, 3C)
    T* atty;      // (B, T, C) attention output before the projection
    T* att;       // (B, NH, T, T) softmax
    T* res2;      // (B, T, C) residual stream after the attention branch
    T* ln2;       // (B, T, C)
    T* ln2_mean;  // (B, T)
    T* ln2_rstd;  // (B, T)
    T* fch;       // (B, T, 4C) MLP hidden, before GELU
    T* fch_gelu;  // (B, T, 4C)
  };

  // Without `allocate`, only counts the arena: the model is for ActivationBytes() alone.
  GptModel(const GptConfig& config, int max_b, int max_t, Checkpointing level, bool allocate);

  // Block `layer`'s forward into acts_[layer]. With `recompute` (the start of its backward),
  // only the ops whose outputs the level does not keep per layer, and never the block's output.
  void RunBlock(int layer, const T* block, bool recompute);

  // Offsets (floats) of each tensor in the head and block units, from UnitTensors().
  std::vector<size_t> head_offsets_;
  std::vector<size_t> block_offsets_;

  GptConfig config_;
  using CpuModelBase<T>::mb_;
  using CpuModelBase<T>::arena_;
  using CpuModelBase<T>::logits_;
  using CpuModelBase<T>::losses_;
  // residual_[l] is the input of block l; residual_[L] feeds the final LayerNorm.
  std::vector<T*> residual_;  // L + 1 of (B, T, C); residual_[0] is the encoder output
  std::vector<BlockActs> acts_;
  T* lnf_;       // (B, T, C)
  T* lnf_mean_;  // (B, T)
  T* lnf_rstd_;  // (B, T)
  // Scratch shared by all blocks: the forward's projection output and the backward's
  // activation gradients (one block at a time, so one set suffices).
  T* proj_;   // (B, T, C)
  T* dres_;   // (B, T, C) gradient of the residual stream, flowing down through the blocks
  T* dln_;    // (B, T, C) gradient of a LayerNorm output
  T* datty_;  // (B, T, C)
  T* dqkv_;   // (B, T, 3C)
  T* dfch_;   // (B, T, 4C)
  T* dgelu_;  // (B, T, 4C)
  T* datt_;   // (T, T) attention backward scratch
};

extern template class GptModel<float>;
extern template class GptModel<double>;

}  // namespace weft::engine::cpu

namespace weft::engine {

// GPT-2 in fp32: the CpuModel of Gpt2Arch (CreateCpuModel), also built directly from a config
// by tests and benchmarks.
class GptCpu final : public cpu::FloatCpuModel<cpu::GptModel<float>> {
 public:
  using FloatCpuModel::FloatCpuModel;
};

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_CPU_GPT2_MODEL_H_
