// The finite-difference harness of the CPU ops' gradient checks (ops_test.cc,
// cpu/llama_ops_test.cc).
//
// Every op is checked in double (the ops are templates), where central differences are
// accurate to ~1e-10, so the analytic gradient must match to
//   |analytic - numeric| <= kGradTol * max(1, |numeric|),  kGradTol = 1e-8
// (the worst observed is ~2e-10),
// for EVERY coordinate of every differentiable input (the shapes are tiny). The scalar being
// differentiated is sum(out .* dout) for a random dout, so all output positions count.
// Gradient buffers start filled with a non-zero value: what the backward adds on top of it is
// what is checked, which tests the accumulate (+=) contract at the same time.
// The float instantiation (what the engine runs) must then agree with double, outputs and
// gradients, to kFloatTol = 2e-5 relative to the largest magnitude of the tensor.
#ifndef WEFT_TESTS_WORKER_ENGINE_GRAD_CHECK_H_
#define WEFT_TESTS_WORKER_ENGINE_GRAD_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace weft::engine::cpu {

constexpr double kGradTol = 1e-8;
constexpr double kFloatTol = 2e-5;
constexpr double kStep = 1e-5;      // central-difference step (double)
constexpr double kPrefill = 0.375;  // gradient buffers start here (exact in float and double)

using Tensors = std::vector<std::vector<double>>;

inline std::vector<double> RandomVector(std::mt19937_64& rng, size_t n, double mean = 0.0,
                                        double stddev = 1.0) {
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<double> x(n);
  for (double& v : x) v = dist(rng);
  return x;
}

template <typename T>
std::vector<std::vector<T>> Cast(const Tensors& x) {
  std::vector<std::vector<T>> out;
  for (const auto& t : x) out.emplace_back(t.begin(), t.end());
  return out;
}

inline double MaxAbs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

// `forward(inputs)` returns the op's output; `backward(inputs, dout, &grads)` accumulates the
// input gradients. Both are templated lambdas, run here for double and for float.
template <typename Forward, typename Backward>
void CheckOp(Forward forward, Backward backward, const Tensors& inputs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<double> out = forward(inputs);
  const std::vector<double> dout = RandomVector(rng, out.size());

  Tensors grads;
  for (const auto& x : inputs) grads.emplace_back(x.size(), kPrefill);
  backward(inputs, dout, &grads);
  for (auto& g : grads) {
    for (double& v : g) v -= kPrefill;
  }

  auto objective = [&](const Tensors& x) {
    const std::vector<double> y = forward(x);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dout[i];
    return s;
  };
  Tensors x = inputs;
  double worst = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    for (size_t i = 0; i < x[k].size(); ++i) {
      const double saved = x[k][i];
      x[k][i] = saved + kStep;
      const double plus = objective(x);
      x[k][i] = saved - kStep;
      const double minus = objective(x);
      x[k][i] = saved;
      const double numeric = (plus - minus) / (2 * kStep);
      worst = std::max(worst, std::abs(grads[k][i] - numeric) / std::max(1.0, std::abs(numeric)));
      EXPECT_LE(std::abs(grads[k][i] - numeric), kGradTol * std::max(1.0, std::abs(numeric)))
          << "input " << k << " element " << i << ": analytic " << grads[k][i] << " numeric "
          << numeric;
    }
  }

  char worst_text[32];
  std::snprintf(worst_text, sizeof(worst_text), "%.3g", worst);
  testing::Test::RecordProperty("worst_gradient_error", worst_text);

  // The float instantiation against the double one.
  const std::vector<std::vector<float>> xf = Cast<float>(inputs);
  const std::vector<float> outf = forward(xf);
  ASSERT_EQ(outf.size(), out.size());
  const double out_scale = std::max(1.0, MaxAbs(out));
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(outf[i], out[i], kFloatTol * out_scale) << "float output " << i;
  }
  std::vector<std::vector<float>> gradsf;
  for (const auto& v : inputs) gradsf.emplace_back(v.size(), 0.0f);
  backward(xf, std::vector<float>(dout.begin(), dout.end()), &gradsf);
  for (size_t k = 0; k < grads.size(); ++k) {
    const double scale = std::max(1e-3, MaxAbs(grads[k]));
    for (size_t i = 0; i < grads[k].size(); ++i) {
      EXPECT_NEAR(gradsf[k][i], grads[k][i], kFloatTol * scale)
          << "float gradient of input " << k << " element " << i;
    }
  }
}

}  // namespace weft::engine::cpu

#endif  // WEFT_TESTS_WORKER_ENGINE_GRAD_CHECK_H_
