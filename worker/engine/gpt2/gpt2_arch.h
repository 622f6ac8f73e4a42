// GPT-2's parameter layout and initialisation (device-independent); its models are
// engine/cpu/gpt2_model.h (fp32) and engine/cuda/gpt2_model.h (bf16).
//
//   unit 0 ("head"):  wte (Vp, C), wpe (maxT, C), lnfw (C), lnfb (C) — the LM head is tied to wte
//   unit 1+l (block l): ln1w (C), ln1b (C), qkvw (3C, C), qkvb (3C), attprojw (C, C),
//                       attprojb (C), ln2w (C), ln2b (C), fcw (4C, C), fcb (4C),
//                       fcprojw (C, 4C), fcprojb (C)
// Weights are (out, in) like PyTorch's Linear and llm.c.
#ifndef WEFT_WORKER_ENGINE_GPT2_GPT2_ARCH_H_
#define WEFT_WORKER_ENGINE_GPT2_GPT2_ARCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/engine/model_arch.h"
#include "weft/v1/job.pb.h"

namespace weft::engine {

struct GptConfig {
  int num_layers = 0;
  int hidden_size = 0;        // C
  int num_heads = 0;          // NH; divides C
  int vocab_size = 0;         // V: token ids are in [0, V)
  int padded_vocab_size = 0;  // Vp >= V: rows of wte allocated
  int context_length = 0;     // maxT: rows of wpe
};

// Sizes from a ModelSpec; padded_vocab_size 0 takes the proto's default (V rounded up to a
// multiple of 128).
GptConfig ConfigFromSpec(const weft::v1::ModelSpec& spec);

// Index of each tensor in UnitTensors(config, 0), the head, and UnitTensors(config, 1 + l), a
// block: the layout order.
enum HeadTensor : int { kWte, kWpe, kLnfw, kLnfb, kNumHeadTensors };
enum BlockTensor : int {
  kLn1w,
  kLn1b,
  kQkvw,
  kQkvb,
  kAttprojw,
  kAttprojb,
  kLn2w,
  kLn2b,
  kFcw,
  kFcb,
  kFcprojw,
  kFcprojb,
  kNumBlockTensors
};

// The layout as free functions of the config (what Gpt2Arch answers; tests use them directly).
int NumUnits(const GptConfig& config);               // num_layers + 1
size_t UnitSize(const GptConfig& config, int unit);  // floats
std::vector<TensorInfo> UnitTensors(const GptConfig& config, int unit);
void UnitDecayMask(const GptConfig& config, int unit, uint8_t* mask);
// GPT-2 init: N(0, 0.02) weights and embeddings, residual projections scaled by
// 1 / sqrt(2 * num_layers), zero biases, unit LayerNorm weights. Each element depends only on
// (seed, unit, its index in the unit). Padding rows of wte (>= V) are 0: they are never read as
// embeddings and never receive gradient.
void InitUnit(const GptConfig& config, int unit, uint64_t seed, float* params);

class Gpt2Arch final : public ModelArch {
 public:
  explicit Gpt2Arch(const GptConfig& config) : config_(config) {}

  const GptConfig& config() const { return config_; }

  std::string name() const override { return "gpt2"; }
  int num_layers() const override { return config_.num_layers; }
  int vocab_size() const override { return config_.vocab_size; }
  int padded_vocab_size() const override { return config_.padded_vocab_size; }
  int context_length() const override { return config_.context_length; }
  size_t UnitSize(int unit) const override { return engine::UnitSize(config_, unit); }
  std::vector<TensorInfo> UnitTensors(int unit) const override {
    return engine::UnitTensors(config_, unit);
  }

 private:
  const GptConfig config_;
};

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_GPT2_GPT2_ARCH_H_
