#include "worker/engine/gpt2/gpt2_arch.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace weft::engine {
namespace {

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
    AppendTensor(&t, "wte", {config.padded_vocab_size, c}, true, TensorInit::kNormal);
    t.back().live_size = static_cast<size_t>(config.vocab_size) * c;
    AppendTensor(&t, "wpe", {config.context_length, c}, true, TensorInit::kNormal);
    AppendTensor(&t, "lnfw", {c}, false, TensorInit::kOnes);
    AppendTensor(&t, "lnfb", {c}, false, TensorInit::kZeros);
    return t;
  }
  const std::string p = "h." + std::to_string(unit - 1) + ".";
  t.reserve(kNumBlockTensors);
  AppendTensor(&t, p + "ln1w", {c}, false, TensorInit::kOnes);
  AppendTensor(&t, p + "ln1b", {c}, false, TensorInit::kZeros);
  AppendTensor(&t, p + "qkvw", {3 * c, c}, true, TensorInit::kNormal);
  AppendTensor(&t, p + "qkvb", {3 * c}, false, TensorInit::kZeros);
  AppendTensor(&t, p + "attprojw", {c, c}, true, TensorInit::kResidualNormal);
  AppendTensor(&t, p + "attprojb", {c}, false, TensorInit::kZeros);
  AppendTensor(&t, p + "ln2w", {c}, false, TensorInit::kOnes);
  AppendTensor(&t, p + "ln2b", {c}, false, TensorInit::kZeros);
  AppendTensor(&t, p + "fcw", {4 * c, c}, true, TensorInit::kNormal);
  AppendTensor(&t, p + "fcb", {4 * c}, false, TensorInit::kZeros);
  AppendTensor(&t, p + "fcprojw", {c, 4 * c}, true, TensorInit::kResidualNormal);
  AppendTensor(&t, p + "fcprojb", {c}, false, TensorInit::kZeros);
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
  FillDecayMask(UnitTensors(config, unit), mask);
}

void InitUnit(const GptConfig& config, int unit, uint64_t seed, float* params) {
  // One stream per (seed, unit); elements are indexed by their offset in the unit.
  InitTensors(UnitTensors(config, unit), InitStreamKey(seed, unit), config.num_layers, params);
}

}  // namespace weft::engine
