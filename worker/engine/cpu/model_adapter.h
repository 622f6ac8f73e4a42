// FloatCpuModel<Model>: a templated CPU model (GptModel<float>, LlamaModel<float>: each keeps
// its element type T generic so that tests can run it in double) exposed as the CpuModel the
// ZeRO engine and sampling drive. Pure forwarding; the contract is CpuModel's (model.h).
#ifndef WEFT_WORKER_ENGINE_CPU_MODEL_ADAPTER_H_
#define WEFT_WORKER_ENGINE_CPU_MODEL_ADAPTER_H_

#include <cstddef>
#include <cstdint>

#include "worker/engine/cpu/model.h"

namespace weft::engine::cpu {

template <typename Model>
class FloatCpuModel : public CpuModel {
 public:
  template <typename Config>
  FloatCpuModel(const Config& config, int max_b, int max_t, Checkpointing level)
      : model_(config, max_b, max_t, level) {}

  const auto& config() const { return model_.config(); }
  Checkpointing checkpointing() const override { return model_.checkpointing(); }
  int b() const override { return model_.b(); }
  int t() const override { return model_.t(); }
  void SetShape(int b, int t) override { model_.SetShape(b, t); }
  void SetDocuments(const int32_t* doc_starts, bool reset_positions) override {
    model_.SetDocuments(doc_starts, reset_positions);
  }
  void EncoderForward(const float* head, const int32_t* tokens) override {
    model_.EncoderForward(head, tokens);
  }
  void BlockForward(int layer, const float* block) override { model_.BlockForward(layer, block); }
  float ClassifierForward(const float* head, const int32_t* targets, float loss_scale) override {
    return static_cast<float>(model_.ClassifierForward(head, targets, loss_scale));
  }
  const float* Logits() const override { return model_.Logits(); }
  const float* Losses() const override { return model_.Losses(); }
  void ClassifierBackward(const float* head, float* head_grad) override {
    model_.ClassifierBackward(head, head_grad);
  }
  void BlockBackward(int layer, const float* block, float* block_grad) override {
    model_.BlockBackward(layer, block, block_grad);
  }
  void EncoderBackward(float* head_grad) override { model_.EncoderBackward(head_grad); }
  size_t ActivationBytes() const override { return model_.ActivationBytes(); }

 private:
  Model model_;
};

}  // namespace weft::engine::cpu

#endif  // WEFT_WORKER_ENGINE_CPU_MODEL_ADAPTER_H_
