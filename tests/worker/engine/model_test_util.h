// Helpers of the whole-model CPU tests (gpt_test.cc, cpu/llama_model_test.cc): parameters as
// one vector per unit, random values far from init, and one forward / forward + backward of
// any CPU model (GptModel<T>, LlamaModel<T> or a CpuModel) in the CpuModel call order.
#ifndef WEFT_TESTS_WORKER_ENGINE_MODEL_TEST_UTIL_H_
#define WEFT_TESTS_WORKER_ENGINE_MODEL_TEST_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/model_arch.h"

namespace weft::engine {

using Units = std::vector<std::vector<double>>;

inline std::string Sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", x);
  return buf;
}

// Parameters far from the small init (weights ~0.3, norm weights ~1 +- 0.2, biases ~0.2,
// vocabulary padding rows non-zero too) so every nonlinearity is exercised in a check.
inline Units RandomParams(const ModelArch& arch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Units units(arch.NumUnits());
  for (int u = 0; u < arch.NumUnits(); ++u) {
    units[u].resize(arch.UnitSize(u));
    for (const TensorInfo& info : arch.UnitTensors(u)) {
      double mean = 0.0, stddev = 0.3;
      if (info.init == TensorInit::kOnes) mean = 1.0, stddev = 0.2;
      if (info.init == TensorInit::kZeros) stddev = 0.2;
      std::normal_distribution<double> dist(mean, stddev);
      for (size_t i = 0; i < info.size; ++i) units[u][info.offset + i] = dist(rng);
    }
  }
  return units;
}

template <typename T, typename U>
std::vector<std::vector<T>> CastUnits(const std::vector<std::vector<U>>& x) {
  std::vector<std::vector<T>> out;
  for (const auto& u : x) out.emplace_back(u.begin(), u.end());
  return out;
}

template <typename T>
std::vector<std::vector<T>> ZerosLike(const std::vector<std::vector<T>>& x) {
  std::vector<std::vector<T>> out;
  for (const auto& u : x) out.emplace_back(u.size(), T(0));
  return out;
}

// One forward (loss only).
template <typename Model, typename T>
double Forward(Model& model, const std::vector<std::vector<T>>& params,
               const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
               T loss_scale) {
  const int layers = static_cast<int>(params.size()) - 1;
  model.EncoderForward(params[0].data(), tokens.data());
  for (int l = 0; l < layers; ++l) model.BlockForward(l, params[1 + l].data());
  return model.ClassifierForward(params[0].data(), targets.data(), loss_scale);
}

// Forward + backward, gradients accumulated into `grads`; returns the mean loss.
template <typename Model, typename T>
double ForwardBackward(Model& model, const std::vector<std::vector<T>>& params,
                       const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                       T loss_scale, std::vector<std::vector<T>>* grads) {
  const double loss = Forward(model, params, tokens, targets, loss_scale);
  const int layers = static_cast<int>(params.size()) - 1;
  model.ClassifierBackward(params[0].data(), (*grads)[0].data());
  for (int l = layers - 1; l >= 0; --l) {
    model.BlockBackward(l, params[1 + l].data(), (*grads)[1 + l].data());
  }
  model.EncoderBackward((*grads)[0].data());
  return loss;
}

}  // namespace weft::engine

#endif  // WEFT_TESTS_WORKER_ENGINE_MODEL_TEST_UTIL_H_
