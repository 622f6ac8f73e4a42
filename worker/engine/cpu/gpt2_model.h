// GPT-2 on the CPU (layout: engine/gpt2/gpt2_arch.h). GptModel<T> is the model over the CPU
// ops, templated on the element type: GptModel<float> is the engine behind GptCpu, the
// CpuModel the ZeRO engine drives; GptModel<double> exists for tight whole-model gradient
// checks. Both keep CpuModel's contract (engine/cpu/model.h): activations owned, parameters and
// gradients not; every backward ACCUMULATES (+=) into the unit's gradient buffer.
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
  GptModel(const GptConfig& config, int max_b, int max_t);

  const GptConfig& config() const { return config_; }

  void EncoderForward(const T* head, const int32_t* tokens);
  void BlockForward(int layer, const T* block);
  // Returns the mean loss in double (0 for inference, targets == nullptr).
  double ClassifierForward(const T* head, const int32_t* targets, T loss_scale);
  void ClassifierBackward(const T* head, T* head_grad);
  void BlockBackward(int layer, const T* block, T* block_grad);
  void EncoderBackward(T* head_grad);

 private:
  // Activations one block keeps from its forward for its backward.
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
