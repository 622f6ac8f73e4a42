// Helpers of the whole-model CPU tests (gpt_test.cc, cpu/llama_model_test.cc): parameters as
// one vector per unit, random values far from init, and one forward / forward + backward of
// any CPU model (GptModel<T>, LlamaModel<T> or a CpuModel) in the CpuModel call order.
#ifndef WEFT_TESTS_WORKER_ENGINE_MODEL_TEST_UTIL_H_
#define WEFT_TESTS_WORKER_ENGINE_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
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

// Every coordinate of every unit of `arch`, in double: the analytic `grads` against central
// differences (h = 1e-5) of `objective()`, which reads `*x`; required
// |analytic - numeric| <= 1e-7 * max(1e-2, |numeric|). Returns the worst relative error.
template <typename Objective>
double ExpectGradientsMatchFiniteDifferences(const ModelArch& arch, const Units& grads, Units* x,
                                             Objective objective) {
  const double h = 1e-5;
  double worst = 0;
  for (size_t u = 0; u < x->size(); ++u) {
    for (const TensorInfo& info : arch.UnitTensors(static_cast<int>(u))) {
      for (size_t i = 0; i < info.size; ++i) {
        double& p = (*x)[u][info.offset + i];
        const double saved = p;
        p = saved + h;
        const double plus = objective();
        p = saved - h;
        const double minus = objective();
        p = saved;
        const double numeric = (plus - minus) / (2 * h);
        const double analytic = grads[u][info.offset + i];
        const double err = std::abs(analytic - numeric) / std::max(1e-2, std::abs(numeric));
        worst = std::max(worst, err);
        EXPECT_LE(err, 1e-7) << info.name << "[" << i << "]: analytic " << analytic << " numeric "
                             << numeric;
      }
    }
  }
  return worst;
}

// Every element of `grads` within `tolerance` times the largest |gradient| of its unit in
// `expected` (a small gradient can be the sum of much larger, cancelling terms).
template <typename T>
void ExpectUnitsNear(const std::vector<std::vector<T>>& grads, const Units& expected,
                     double tolerance) {
  for (size_t u = 0; u < grads.size(); ++u) {
    double scale = 0;
    for (double g : expected[u]) scale = std::max(scale, std::abs(g));
    for (size_t i = 0; i < grads[u].size(); ++i) {
      ASSERT_NEAR(grads[u][i], expected[u][i], tolerance * scale)
          << "unit " << u << " element " << i;
    }
  }
}

// The logits (B, T, Vp) of an inference forward of `tokens` (B, T) at shape (b, t).
template <typename Model, typename T>
std::vector<T> InferenceLogits(Model& model, const std::vector<std::vector<T>>& params,
                               const int32_t* tokens, int b, int t, int vp) {
  const int layers = static_cast<int>(params.size()) - 1;
  model.SetShape(b, t);
  model.EncoderForward(params[0].data(), tokens);
  for (int l = 0; l < layers; ++l) model.BlockForward(l, params[1 + l].data());
  model.ClassifierForward(params[0].data(), nullptr, T(1));
  return std::vector<T>(model.Logits(), model.Logits() + static_cast<size_t>(b) * t * vp);
}

// Causality, as sampling relies on (B = 1, a growing T, a model sized for training): the
// logits of a prefix of row 1 of `tokens` (b, t) equal those of the full batch's row 1.
template <typename Model>
void ExpectPrefixLogitsMatch(Model& model, const std::vector<std::vector<float>>& params,
                             const std::vector<int32_t>& tokens, int b, int t, int prefix, int vp) {
  const std::vector<float> full = InferenceLogits(model, params, tokens.data(), b, t, vp);
  const std::vector<float> part = InferenceLogits(model, params, tokens.data() + t, 1, prefix, vp);
  for (int i = 0; i < prefix * vp; ++i) {
    const float expected = full[static_cast<size_t>(t) * vp + i];
    EXPECT_NEAR(part[i], expected, 1e-5f * std::max(1.0f, std::abs(expected))) << i;
  }
}

}  // namespace weft::engine

#endif  // WEFT_TESTS_WORKER_ENGINE_MODEL_TEST_UTIL_H_
