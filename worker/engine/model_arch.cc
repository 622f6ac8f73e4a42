#include "worker/engine/model_arch.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine {
namespace {

// SplitMix64's finaliser: a bijective 64-bit mixer with good avalanche.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in (0, 1]: never 0, so log() in Box-Muller stays finite.
double ToUnit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

}  // namespace

void AppendTensor(std::vector<TensorInfo>* tensors, std::string name, std::vector<int64_t> shape,
                  bool decay, TensorInit init) {
  TensorInfo info;
  info.name = std::move(name);
  info.offset = tensors->empty() ? 0 : tensors->back().offset + tensors->back().size;
  info.size = 1;
  for (int64_t d : shape) info.size *= static_cast<size_t>(d);
  info.shape = std::move(shape);
  info.decay = decay;
  info.init = init;
  info.live_size = info.size;
  tensors->push_back(std::move(info));
}

void FillDecayMask(const std::vector<TensorInfo>& tensors, uint8_t* mask) {
  for (const TensorInfo& info : tensors) {
    for (size_t i = 0; i < info.size; ++i) mask[info.offset + i] = info.decay ? 1 : 0;
  }
}

uint64_t InitStreamKey(uint64_t seed, int unit) {
  return Mix(seed ^ Mix(0x5745465400000000ULL + static_cast<uint64_t>(unit)));
}

// Box-Muller, cosine branch only; any element can be recomputed on its own.
double StandardNormalAt(uint64_t key, uint64_t index) {
  const double u1 = ToUnit(Mix(key ^ Mix(2 * index)));
  const double u2 = ToUnit(Mix(key ^ Mix(2 * index + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void InitTensors(const std::vector<TensorInfo>& tensors, uint64_t key, int num_layers,
                 float* params) {
  constexpr double kInitStd = 0.02;
  const double residual_std = kInitStd / std::sqrt(2.0 * num_layers);
  for (const TensorInfo& info : tensors) {
    float* p = params + info.offset;
    for (size_t i = 0; i < info.size; ++i) {
      const uint64_t index = info.offset + i;
      if (i >= info.live_size) {
        p[i] = 0.0f;
        continue;
      }
      switch (info.init) {
        case TensorInit::kNormal:
          p[i] = static_cast<float>(kInitStd * StandardNormalAt(key, index));
          break;
        case TensorInit::kResidualNormal:
          p[i] = static_cast<float>(residual_std * StandardNormalAt(key, index));
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

size_t ModelArch::ParameterCount() const {
  size_t total = 0;
  for (int u = 0; u < NumUnits(); ++u) total += UnitSize(u);
  return total;
}

absl::StatusOr<std::unique_ptr<const ModelArch>> MakeModelArch(const weft::v1::ModelSpec& spec) {
  if (spec.architecture() == weft::v1::LLAMA) {
    const LlamaConfig config = LlamaConfigFromSpec(spec);
    const std::vector<std::string> problems = LlamaConfigProblems(config);
    if (!problems.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: not a Llama shape: ", absl::StrJoin(problems, "; ")));
    }
    return std::make_unique<const LlamaArch>(config);
  }
  if (spec.architecture() != weft::v1::GPT2 &&
      spec.architecture() != weft::v1::ARCHITECTURE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.architecture: unknown value ", spec.architecture()));
  }
  const GptConfig config = ConfigFromSpec(spec);
  if (config.num_layers < 1 || config.hidden_size < 1 || config.num_heads < 1 ||
      config.hidden_size % config.num_heads != 0 || config.vocab_size < 1 ||
      config.padded_vocab_size < config.vocab_size || config.context_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: not a GPT-2 shape (num_layers ", config.num_layers, ", hidden_size ",
                     config.hidden_size, ", num_heads ", config.num_heads, ", vocab_size ",
                     config.vocab_size, ", padded_vocab_size ", config.padded_vocab_size,
                     ", context_length ", config.context_length, ")"));
  }
  return std::make_unique<const Gpt2Arch>(config);
}

}  // namespace weft::engine
