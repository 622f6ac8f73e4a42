// Per-layer gradient checks of the GPT-2 CPU ops against central finite differences (the
// harness and its tolerances: grad_check.h).
#include "worker/engine/cpu/ops.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/grad_check.h"

namespace weft::engine::cpu {
namespace {

TEST(EncoderTest, GradientsMatchFiniteDifferences) {
  const int b = 2, t = 3, c = 4, vp = 7, max_t = 4;  // V = 5: rows 5, 6 are padding
  // Token 1 appears three times: its wte row must collect all three.
  const std::vector<int32_t> tokens = {1, 3, 1, 4, 1, 0};
  std::mt19937_64 rng(1);
  const Tensors inputs = {RandomVector(rng, vp * c), RandomVector(rng, max_t * c)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& x) {
    std::vector<T> out(b * t * c);  // (B, T, C)
    EncoderForward(out.data(), tokens.data(), x[0].data(), x[1].data(), nullptr, b, t, c);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& x, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    EncoderBackward((*g)[0].data(), (*g)[1].data(), dout.data(), tokens.data(), nullptr, b, t, c);
  };
  CheckOp(forward, backward, inputs, 11);
}

TEST(EncoderTest, UnusedAndPaddingRowsGetNoGradient) {
  const int b = 1, t = 2, c = 3, vp = 6;
  const std::vector<int32_t> tokens = {2, 2};
  std::vector<float> dwte(vp * c, 0.0f), dwpe(t * c, 0.0f), dout(b * t * c, 1.0f);
  EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), nullptr, b, t, c);
  for (int row = 0; row < vp; ++row) {
    for (int i = 0; i < c; ++i) EXPECT_EQ(dwte[row * c + i], row == 2 ? 2.0f : 0.0f);
  }
}

TEST(LayerNormTest, GradientsMatchFiniteDifferences) {
  const int n = 3, c = 5;
  std::mt19937_64 rng(2);
  // An input row with a large mean relative to its spread exercises the two-pass variance.
  std::vector<double> x = RandomVector(rng, n * c);
  for (int i = 0; i < c; ++i) x[2 * c + i] = 30.0 + 0.5 * x[2 * c + i];
  const Tensors inputs = {x, RandomVector(rng, c, 1.0, 0.3), RandomVector(rng, c, 0.0, 0.3)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(n * c), mean(n), rstd(n);
    LayerNormForward(out.data(), mean.data(), rstd.data(), in[0].data(), in[1].data(), in[2].data(),
                     n, c);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    std::vector<T> out(n * c), mean(n), rstd(n);
    LayerNormForward(out.data(), mean.data(), rstd.data(), in[0].data(), in[1].data(), in[2].data(),
                     n, c);
    LayerNormBackward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), dout.data(), in[0].data(),
                      in[1].data(), mean.data(), rstd.data(), n, c);
  };
  CheckOp(forward, backward, inputs, 12);
}

TEST(LayerNormTest, NormalizesRows) {
  const int n = 2, c = 6;
  std::vector<double> x = {1, 2, 3, 4, 5, 6, -3, 0, 3, 9, -9, 0};
  std::vector<double> w(c, 1.0), bias(c, 0.0), out(n * c), mean(n), rstd(n);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), n, c);
  EXPECT_DOUBLE_EQ(mean[0], 3.5);
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(35.0 / 12.0 + kLayerNormEps), 1e-15);
  for (int r = 0; r < n; ++r) {
    double s = 0, s2 = 0;
    for (int i = 0; i < c; ++i) {
      s += out[r * c + i];
      s2 += out[r * c + i] * out[r * c + i];
    }
    EXPECT_NEAR(s / c, 0.0, 1e-12);
    EXPECT_NEAR(s2 / c, 1.0, 1e-4);  // 1 up to the epsilon inside the root
  }
}

TEST(MatmulTest, GradientsMatchFiniteDifferencesWithBias) {
  const int n = 4, c = 3, oc = 5;
  std::mt19937_64 rng(3);
  const Tensors inputs = {RandomVector(rng, n * c), RandomVector(rng, oc * c),
                          RandomVector(rng, oc)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(n * oc);
    MatmulForward(out.data(), in[0].data(), in[1].data(), in[2].data(), n, c, oc);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    MatmulBackward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), dout.data(), in[0].data(),
                   in[1].data(), n, c, oc);
  };
  CheckOp(forward, backward, inputs, 13);
}

TEST(MatmulTest, GradientsMatchFiniteDifferencesWithoutBias) {
  const int n = 3, c = 6, oc = 2;
  std::mt19937_64 rng(4);
  const Tensors inputs = {RandomVector(rng, n * c), RandomVector(rng, oc * c)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(n * oc);
    MatmulForward(out.data(), in[0].data(), in[1].data(), static_cast<const T*>(nullptr), n, c, oc);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    MatmulBackward((*g)[0].data(), (*g)[1].data(), static_cast<T*>(nullptr), dout.data(),
                   in[0].data(), in[1].data(), n, c, oc);
  };
  CheckOp(forward, backward, inputs, 14);
}

TEST(MatmulTest, ComputesLinearLayer) {
  // out = inp @ W^T + b, by hand: inp (1, 2) = [1, 2]; W (3, 2); b (3).
  const std::vector<double> inp = {1, 2}, w = {1, 0, 0, 1, 3, -1}, bias = {0.5, 0, -1};
  std::vector<double> out(3);
  MatmulForward(out.data(), inp.data(), w.data(), bias.data(), 1, 2, 3);
  EXPECT_EQ(out, (std::vector<double>{1.5, 2, 0}));
}

TEST(AttentionTest, GradientsMatchFiniteDifferences) {
  const int b = 2, t = 4, c = 6, nh = 2;
  std::mt19937_64 rng(5);
  const Tensors inputs = {RandomVector(rng, b * t * 3 * c)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(b * t * c), att(b * nh * t * t);
    AttentionForward(out.data(), att.data(), in[0].data(), nullptr, b, t, c, nh);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    std::vector<T> out(b * t * c), att(b * nh * t * t), scratch(t * t);
    AttentionForward(out.data(), att.data(), in[0].data(), nullptr, b, t, c, nh);
    AttentionBackward((*g)[0].data(), scratch.data(), dout.data(), in[0].data(), att.data(),
                      nullptr, b, t, c, nh);
  };
  CheckOp(forward, backward, inputs, 15);
}

TEST(AttentionTest, IsCausalAndKeepsNormalizedSoftmax) {
  const int b = 1, t = 5, c = 4, nh = 2;
  std::mt19937_64 rng(6);
  std::vector<double> qkv = RandomVector(rng, b * t * 3 * c);
  std::vector<double> out(b * t * c), att(b * nh * t * t);
  AttentionForward(out.data(), att.data(), qkv.data(), nullptr, b, t, c, nh);
  for (int h = 0; h < nh; ++h) {
    for (int i = 0; i < t; ++i) {
      double sum = 0;
      for (int j = 0; j < t; ++j) {
        const double a = att[(h * t + i) * t + j];
        if (j > i) {
          EXPECT_EQ(a, 0.0) << "future position " << j << " attended from " << i;
        }
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-14);
    }
  }
  // Changing everything at the last position leaves every earlier output bit-identical.
  for (int i = 0; i < 3 * c; ++i) qkv[(t - 1) * 3 * c + i] += 1.0;
  std::vector<double> out2(b * t * c);
  AttentionForward(out2.data(), att.data(), qkv.data(), nullptr, b, t, c, nh);
  for (int i = 0; i < (t - 1) * c; ++i) EXPECT_EQ(out2[i], out[i]) << i;
  EXPECT_NE(out2[(t - 1) * c], out[(t - 1) * c]);
}

TEST(GeluTest, GradientsMatchFiniteDifferences) {
  const Tensors inputs = {{-6.0, -3.0, -1.5, -0.7, -0.1, 0.0, 0.2, 0.9, 1.7, 3.5, 7.0}};
  const int64_t n = static_cast<int64_t>(inputs[0].size());
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(n);
    GeluForward(out.data(), in[0].data(), n);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    GeluBackward((*g)[0].data(), in[0].data(), dout.data(), n);
  };
  CheckOp(forward, backward, inputs, 16);
}

TEST(GeluTest, MatchesKnownValues) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated independently.
  const std::vector<double> x = {-1.0, 0.0, 1.0, 2.0};
  const std::vector<double> expected = {-0.15880800939172324, 0.0, 0.8411919906082768,
                                        1.954597694087775};
  std::vector<double> out(x.size());
  GeluForward(out.data(), x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-15) << x[i];
}

TEST(ResidualTest, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(7);
  const int64_t n = 6;
  const Tensors inputs = {RandomVector(rng, n), RandomVector(rng, n)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(n);
    ResidualForward(out.data(), in[0].data(), in[1].data(), n);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    ResidualBackward((*g)[0].data(), (*g)[1].data(), dout.data(), n);
  };
  CheckOp(forward, backward, inputs, 17);
}

// The fused op's "output" is the scaled mean loss; its "backward" is the dlogits it leaves
// in place, times the upstream scalar.
void CheckClassifier(int n, int v, int vp, double loss_scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 3 + 1) % v);
  const Tensors inputs = {RandomVector(rng, n * vp, 0.0, 2.0)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> logits = in[0], losses(n);
    const double loss = SoftmaxCrossEntropyForwardBackward(
        logits.data(), losses.data(), targets.data(), n, v, vp, static_cast<T>(loss_scale));
    return std::vector<T>{static_cast<T>(loss_scale * loss)};
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    std::vector<T> logits = in[0], losses(n);
    SoftmaxCrossEntropyForwardBackward(logits.data(), losses.data(), targets.data(), n, v, vp,
                                       static_cast<T>(loss_scale));
    for (size_t i = 0; i < logits.size(); ++i) (*g)[0][i] += dout[0] * logits[i];
  };
  CheckOp(forward, backward, inputs, seed + 100);
}

TEST(ClassifierTest, GradientsMatchFiniteDifferences) { CheckClassifier(3, 5, 5, 1.0, 18); }

TEST(ClassifierTest, GradientsMatchFiniteDifferencesPaddedAndScaled) {
  CheckClassifier(4, 5, 8, 0.25, 19);
}

TEST(ClassifierTest, PaddingIsExcludedAndLossEqualsUnpadded) {
  const int n = 2, v = 3, vp = 5;
  const std::vector<double> row0 = {1.0, 2.0, 0.5}, row1 = {-1.0, 0.0, 4.0};
  const std::vector<int32_t> targets = {1, 0};
  // Padded columns hold huge values: were they in the softmax, they would dominate it.
  std::vector<double> padded = {1.0, 2.0, 0.5, 50.0, 80.0, -1.0, 0.0, 4.0, 90.0, 1e3};
  std::vector<double> unpadded = {1.0, 2.0, 0.5, -1.0, 0.0, 4.0};
  std::vector<double> losses_p(n), losses_u(n);
  const double loss_p = SoftmaxCrossEntropyForwardBackward(padded.data(), losses_p.data(),
                                                           targets.data(), n, v, vp, 1.0);
  const double loss_u = SoftmaxCrossEntropyForwardBackward(unpadded.data(), losses_u.data(),
                                                           targets.data(), n, v, v, 1.0);
  // By hand: -log softmax(row)[target].
  auto nll = [](const std::vector<double>& r, int target) {
    return std::log(std::exp(r[0]) + std::exp(r[1]) + std::exp(r[2])) - r[target];
  };
  EXPECT_NEAR(losses_p[0], nll(row0, 1), 1e-14);
  EXPECT_NEAR(losses_p[1], nll(row1, 0), 1e-14);
  EXPECT_NEAR(loss_p, (nll(row0, 1) + nll(row1, 0)) / 2, 1e-14);
  EXPECT_EQ(loss_p, loss_u);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < v; ++j) EXPECT_EQ(padded[i * vp + j], unpadded[i * v + j]);
    for (int j = v; j < vp; ++j) EXPECT_EQ(padded[i * vp + j], 0.0) << "padding gradient";
  }
}

TEST(ClassifierTest, StaysFiniteForExtremeLogits) {
  const int n = 1, v = 3;
  std::vector<float> logits = {1000.0f, -1000.0f, 0.0f};  // p[target] underflows to 0 in float
  std::vector<float> losses(n);
  const std::vector<int32_t> targets = {1};
  const double loss = SoftmaxCrossEntropyForwardBackward(logits.data(), losses.data(),
                                                         targets.data(), n, v, v, 1.0f);
  EXPECT_NEAR(loss, 2000.0, 1e-3);
  EXPECT_NEAR(logits[0], 1.0f, 1e-6);
  EXPECT_NEAR(logits[1], -1.0f, 1e-6);
}

}  // namespace
}  // namespace weft::engine::cpu
