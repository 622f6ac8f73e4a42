#include "worker/engine/llama/llama_arch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace weft::engine {
namespace {

void CheckUnit(const LlamaConfig& config, int unit) {
  if (unit >= 0 && unit <= config.num_layers) return;
  std::fprintf(stderr, "weft::engine: llama unit %d out of range [0, %d)\n", unit,
               config.num_layers + 1);
  std::abort();
}

}  // namespace

std::optional<LlamaFamily> LlamaFamilyOf(weft::v1::Architecture architecture) {
  switch (architecture) {
    case weft::v1::LLAMA:
      return LlamaFamily::kLlama;
    case weft::v1::QWEN2:
      return LlamaFamily::kQwen2;
    case weft::v1::QWEN3:
      return LlamaFamily::kQwen3;
    case weft::v1::MISTRAL:
      return LlamaFamily::kMistral;
    default:
      return std::nullopt;
  }
}

LlamaConfig LlamaConfigFromSpec(const weft::v1::ModelSpec& spec) {
  LlamaConfig config;
  config.family = LlamaFamilyOf(spec.architecture()).value_or(LlamaFamily::kLlama);
  config.num_layers = spec.num_layers();
  config.hidden_size = spec.hidden_size();
  config.num_heads = spec.num_heads();
  config.head_dim = spec.head_dim();
  config.sliding_window = spec.sliding_window();
  config.num_kv_heads = spec.num_kv_heads() > 0 ? spec.num_kv_heads() : spec.num_heads();
  config.intermediate_size = spec.intermediate_size();
  config.vocab_size = spec.vocab_size();
  config.padded_vocab_size = spec.padded_vocab_size() > 0 ? spec.padded_vocab_size()
                                                          : (spec.vocab_size() + 127) / 128 * 128;
  config.context_length = spec.context_length();
  config.rope_theta = spec.rope_theta() > 0.0 ? spec.rope_theta() : 10000.0;
  const weft::v1::RopeScaling& scaling = spec.rope_scaling();
  config.rope_llama3 = scaling.kind() == weft::v1::RopeScaling::LLAMA3;
  config.rope_factor = scaling.factor();
  config.rope_low_freq_factor = scaling.low_freq_factor();
  config.rope_high_freq_factor = scaling.high_freq_factor();
  config.rope_original_context_length = scaling.original_context_length();
  config.rms_norm_eps = spec.rms_norm_eps() > 0.0 ? spec.rms_norm_eps() : 1e-5;
  config.tie_word_embeddings = spec.tie_word_embeddings();
  return config;
}

std::vector<std::string> LlamaConfigProblems(const LlamaConfig& c) {
  std::vector<std::string> p;
  if (c.num_layers < 1) p.push_back(absl::StrCat("num_layers ", c.num_layers, " < 1"));
  if (c.hidden_size < 1) p.push_back(absl::StrCat("hidden_size ", c.hidden_size, " < 1"));
  if (c.num_heads < 1 || (c.head_dim == 0 && c.hidden_size % std::max(c.num_heads, 1) != 0)) {
    p.push_back(absl::StrCat("num_heads ", c.num_heads, " does not divide hidden_size ",
                             c.hidden_size));
  } else if (c.head_size() < 2 || c.head_size() % 2 != 0) {
    p.push_back(absl::StrCat("head size ", c.head_size(), " is not even (rotary needs pairs)"));
  }
  if (c.sliding_window < 0 || (c.sliding_window > 0 && c.family != LlamaFamily::kMistral)) {
    p.push_back(absl::StrCat("sliding_window ", c.sliding_window,
                             " (Mistral's, >= 0; 0 for the other families)"));
  }
  if (c.num_kv_heads < 1 || c.num_heads % std::max(c.num_kv_heads, 1) != 0) {
    p.push_back(absl::StrCat("num_kv_heads ", c.num_kv_heads, " does not divide num_heads ",
                             c.num_heads));
  }
  if (c.intermediate_size < 1) {
    p.push_back(absl::StrCat("intermediate_size ", c.intermediate_size, " < 1"));
  }
  if (c.vocab_size < 1 || c.padded_vocab_size < c.vocab_size) {
    p.push_back(absl::StrCat("vocab_size ", c.vocab_size, " / padded_vocab_size ",
                             c.padded_vocab_size));
  }
  if (c.context_length < 1) p.push_back(absl::StrCat("context_length ", c.context_length, " < 1"));
  if (!(c.rope_theta > 0.0)) p.push_back(absl::StrCat("rope_theta ", c.rope_theta, " <= 0"));
  if (!(c.rms_norm_eps > 0.0)) p.push_back(absl::StrCat("rms_norm_eps ", c.rms_norm_eps, " <= 0"));
  if (c.rope_llama3 && !(c.rope_factor > 1.0 && c.rope_low_freq_factor > 0.0 &&
                         c.rope_high_freq_factor > c.rope_low_freq_factor &&
                         c.rope_original_context_length >= 1)) {
    p.push_back("rope_scaling LLAMA3 needs factor > 1, 0 < low_freq_factor < high_freq_factor "
                "and original_context_length >= 1");
  }
  return p;
}

std::vector<double> RopeInverseFrequencies(const LlamaConfig& config) {
  const int d = config.head_size();
  std::vector<double> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    inv_freq[i] = 1.0 / std::pow(config.rope_theta, (2.0 * i) / d);
  }
  if (!config.rope_llama3) return inv_freq;
  // Long wavelengths (low frequencies) are stretched by `factor`, short ones kept, and the band
  // between blended linearly in original_context / wavelength.
  const double old_context = config.rope_original_context_length;
  const double low_freq_wavelen = old_context / config.rope_low_freq_factor;
  const double high_freq_wavelen = old_context / config.rope_high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen > low_freq_wavelen) {
      f /= config.rope_factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (old_context / wavelen - config.rope_low_freq_factor) /
                            (config.rope_high_freq_factor - config.rope_low_freq_factor);
      f = (1.0 - smooth) * f / config.rope_factor + smooth * f;
    }
  }
  return inv_freq;
}

std::vector<TensorInfo> LlamaArch::UnitTensors(int unit) const {
  CheckUnit(config_, unit);
  const int64_t c = config_.hidden_size;
  std::vector<TensorInfo> t;
  if (unit == 0) {
    const size_t live = static_cast<size_t>(config_.vocab_size) * c;
    AppendTensor(&t, "embed", {config_.padded_vocab_size, c}, true, TensorInit::kNormal);
    t.back().live_size = live;
    AppendTensor(&t, "norm", {c}, false, TensorInit::kOnes);
    if (!config_.tie_word_embeddings) {
      AppendTensor(&t, "lm_head", {config_.padded_vocab_size, c}, true, TensorInit::kNormal);
      t.back().live_size = live;
    }
    return t;
  }
  const std::string p = "layers." + std::to_string(unit - 1) + ".";
  const int64_t i = config_.intermediate_size;
  t.reserve(kLlamaNumBlockTensors);
  AppendTensor(&t, p + "attn_norm", {c}, false, TensorInit::kOnes);
  AppendTensor(&t, p + "qkvw", {config_.qkv_width(), c}, true, TensorInit::kNormal);
  if (config_.qkv_bias()) {
    AppendTensor(&t, p + "qkvb", {config_.qkv_width()}, false, TensorInit::kZeros);
  }
  if (config_.qk_norm()) {
    AppendTensor(&t, p + "q_norm", {config_.head_size()}, false, TensorInit::kOnes);
    AppendTensor(&t, p + "k_norm", {config_.head_size()}, false, TensorInit::kOnes);
  }
  AppendTensor(&t, p + "attn_out", {c, config_.q_width()}, true, TensorInit::kResidualNormal);
  AppendTensor(&t, p + "mlp_norm", {c}, false, TensorInit::kOnes);
  AppendTensor(&t, p + "gate_up", {2 * i, c}, true, TensorInit::kNormal);
  AppendTensor(&t, p + "down", {c, i}, true, TensorInit::kResidualNormal);
  return t;
}

std::string LlamaArch::name() const {
  switch (config_.family) {
    case LlamaFamily::kQwen2:
      return "qwen2";
    case LlamaFamily::kQwen3:
      return "qwen3";
    case LlamaFamily::kMistral:
      return "mistral";
    case LlamaFamily::kLlama:
      break;
  }
  return "llama";
}

LlamaBlockOffsets LlamaArch::BlockOffsets() const {
  LlamaBlockOffsets offsets;
  offsets.fill(kLlamaAbsent);
  // By the name's last component, so the table's order is free.
  static constexpr std::pair<const char*, LlamaBlockTensor> kNames[] = {
      {"attn_norm", kLlamaAttnNorm}, {"qkvw", kLlamaQkvw},      {"attn_out", kLlamaAttnOut},
      {"mlp_norm", kLlamaMlpNorm},   {"gate_up", kLlamaGateUp}, {"down", kLlamaDown},
      {"qkvb", kLlamaQkvb},          {"q_norm", kLlamaQNorm},   {"k_norm", kLlamaKNorm},
  };
  for (const TensorInfo& info : UnitTensors(1)) {
    const std::string short_name = info.name.substr(info.name.rfind('.') + 1);
    for (const auto& [name, which] : kNames) {
      if (short_name == name) offsets[which] = info.offset;
    }
  }
  return offsets;
}

size_t LlamaArch::UnitSize(int unit) const {
  const std::vector<TensorInfo> t = UnitTensors(unit);
  return t.back().offset + t.back().size;
}

}  // namespace weft::engine
