// GPT-2 parameter layout, initialisation and the fp32 GptCpu facade over GptModel<float>.
#include "worker/engine/gpt.h"

#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "worker/engine/cpu/gpt_model.h"

namespace weft::engine {
namespace {

constexpr double kInitStd = 0.02;

// SplitMix64's finaliser: a bijective 64-bit mixer with good avalanche.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in (0, 1]: never 0, so log() in Box-Muller stays finite.
double ToUnit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

// Standard normal for element `index` of the stream `key` (Box-Muller, cosine branch only).
// Counter-based — a function of (key, index) alone — so a unit's values never depend on how
// it is split across ranks or threads, and any element can be recomputed on its own.
double NormalAt(uint64_t key, uint64_t index) {
  const double u1 = ToUnit(Mix(key ^ Mix(2 * index)));
  const double u2 = ToUnit(Mix(key ^ Mix(2 * index + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void AddTensor(std::vector<TensorInfo>* tensors, std::string name, std::vector<int64_t> shape,
               bool decay, TensorInit init) {
  TensorInfo info;
  info.name = std::move(name);
  info.offset = tensors->empty() ? 0 : tensors->back().offset + tensors->back().size;
  info.size = 1;
  for (int64_t d : shape) info.size *= static_cast<size_t>(d);
  info.shape = std::move(shape);
  info.decay = decay;
  info.init = init;
  tensors->push_back(std::move(info));
}

void CheckUnit(const GptConfig& config, int unit) {
  if (unit >= 0 && unit < NumUnits(config)) return;
  std::fprintf(stderr, "weft::engine: unit %d out of range [0, %d)\n", unit, NumUnits(config));
  std::abort();
}

}  // namespace

GptConfig ConfigFromSpec(const weft::v1::ModelSpec& spec) {
  GptConfig config;
  config.num_layers = spec.num_layers();
  config.hidden_size = spec.hidden_size();
  config.num_heads = spec.num_heads();
  config.vocab_size = spec.vocab_size();
  config.padded_vocab_size = spec.padded_vocab_size() > 0 ? spec.padded_vocab_size()
                                                          : (spec.vocab_size() + 127) / 128 * 128;
  config.context_length = spec.context_length();
  return config;
}

int NumUnits(const GptConfig& config) { return config.num_layers + 1; }

std::vector<TensorInfo> UnitTensors(const GptConfig& config, int unit) {
  CheckUnit(config, unit);
  const int64_t c = config.hidden_size;
  std::vector<TensorInfo> t;
  if (unit == 0) {
    t.reserve(kNumHeadTensors);
    AddTensor(&t, "wte", {config.padded_vocab_size, c}, true, TensorInit::kNormal);
    AddTensor(&t, "wpe", {config.context_length, c}, true, TensorInit::kNormal);
    AddTensor(&t, "lnfw", {c}, false, TensorInit::kOnes);
    AddTensor(&t, "lnfb", {c}, false, TensorInit::kZeros);
    return t;
  }
  const std::string p = "h." + std::to_string(unit - 1) + ".";
  t.reserve(kNumBlockTensors);
  AddTensor(&t, p + "ln1w", {c}, false, TensorInit::kOnes);
  AddTensor(&t, p + "ln1b", {c}, false, TensorInit::kZeros);
  AddTensor(&t, p + "qkvw", {3 * c, c}, true, TensorInit::kNormal);
  AddTensor(&t, p + "qkvb", {3 * c}, false, TensorInit::kZeros);
  AddTensor(&t, p + "attprojw", {c, c}, true, TensorInit::kResidualNormal);
  AddTensor(&t, p + "attprojb", {c}, false, TensorInit::kZeros);
  AddTensor(&t, p + "ln2w", {c}, false, TensorInit::kOnes);
  AddTensor(&t, p + "ln2b", {c}, false, TensorInit::kZeros);
  AddTensor(&t, p + "fcw", {4 * c, c}, true, TensorInit::kNormal);
  AddTensor(&t, p + "fcb", {4 * c}, false, TensorInit::kZeros);
  AddTensor(&t, p + "fcprojw", {c, 4 * c}, true, TensorInit::kResidualNormal);
  AddTensor(&t, p + "fcprojb", {c}, false, TensorInit::kZeros);
  return t;
}

size_t UnitSize(const GptConfig& config, int unit) {
  CheckUnit(config, unit);
  const size_t c = config.hidden_size;
  if (unit == 0) {
    return (static_cast<size_t>(config.padded_vocab_size) + config.context_length) * c + 2 * c;
  }
  return 12 * c * c + 13 * c;
}

void UnitDecayMask(const GptConfig& config, int unit, uint8_t* mask) {
  for (const TensorInfo& info : UnitTensors(config, unit)) {
    for (size_t i = 0; i < info.size; ++i) mask[info.offset + i] = info.decay ? 1 : 0;
  }
}

void InitUnit(const GptConfig& config, int unit, uint64_t seed, float* params) {
  // One stream per (seed, unit); elements are indexed by their offset in the unit.
  const uint64_t key = Mix(seed ^ Mix(0x5745465400000000ULL + static_cast<uint64_t>(unit)));
  const double residual_std = kInitStd / std::sqrt(2.0 * config.num_layers);
  const std::vector<TensorInfo> tensors = UnitTensors(config, unit);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorInfo& info = tensors[k];
    float* p = params + info.offset;
    // wte rows >= V are vocabulary padding: never an input, never a target.
    const size_t live = (unit == 0 && k == kWte)
                            ? static_cast<size_t>(config.vocab_size) * config.hidden_size
                            : info.size;
    for (size_t i = 0; i < info.size; ++i) {
      const uint64_t index = info.offset + i;
      switch (info.init) {
        case TensorInit::kNormal:
          p[i] = i < live ? static_cast<float>(kInitStd * NormalAt(key, index)) : 0.0f;
          break;
        case TensorInit::kResidualNormal:
          p[i] = static_cast<float>(residual_std * NormalAt(key, index));
          break;
        case TensorInit::kZeros:
          p[i] = 0.0f;
          break;
        case TensorInit::kOnes:
          p[i] = 1.0f;
          break;
      }
    }
  }
}

void SetBlasThreads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

int BlasThreads() { return openblas_get_num_threads(); }

GptCpu::GptCpu(const GptConfig& config, int max_b, int max_t)
    : model_(std::make_unique<cpu::GptModel<float>>(config, max_b, max_t)) {}
GptCpu::~GptCpu() = default;
GptCpu::GptCpu(GptCpu&&) noexcept = default;
GptCpu& GptCpu::operator=(GptCpu&&) noexcept = default;

const GptConfig& GptCpu::config() const { return model_->config(); }
int GptCpu::b() const { return model_->b(); }
int GptCpu::t() const { return model_->t(); }
void GptCpu::SetShape(int b, int t) { model_->SetShape(b, t); }

void GptCpu::EncoderForward(const float* head, const int32_t* tokens) {
  model_->EncoderForward(head, tokens);
}
void GptCpu::BlockForward(int layer, const float* block) { model_->BlockForward(layer, block); }
float GptCpu::ClassifierForward(const float* head, const int32_t* targets, float loss_scale) {
  return static_cast<float>(model_->ClassifierForward(head, targets, loss_scale));
}
const float* GptCpu::Logits() const { return model_->Logits(); }
const float* GptCpu::Losses() const { return model_->Losses(); }

void GptCpu::ClassifierBackward(const float* head, float* head_grad) {
  model_->ClassifierBackward(head, head_grad);
}
void GptCpu::BlockBackward(int layer, const float* block, float* block_grad) {
  model_->BlockBackward(layer, block, block_grad);
}
void GptCpu::EncoderBackward(float* head_grad) { model_->EncoderBackward(head_grad); }

size_t GptCpu::ActivationBytes() const { return model_->ActivationBytes(); }

}  // namespace weft::engine
