// AdamW against hand-computed values and an independent double reference, the decay mask,
// shard independence, SumOfSquares and the learning-rate schedule's endpoints.
#include "worker/engine/adamw.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace weft::engine {
namespace {

TEST(AdamWTest, FirstStepMatchesHandComputation) {
  // Step 1 with zero moments: m = 0.1 g, v = 0.05 g^2, m_hat = g, v_hat = g^2, so the Adam
  // step is lr * g / (|g| + eps) = lr * sign(g) (to 2e-8), plus decay lr * wd * p where masked.
  const AdamWConfig config{0.1f, 0.9f, 0.95f, 1e-8f, 0.1f};
  std::vector<float> p = {1.0f, 1.0f, -2.0f, 0.5f};
  const std::vector<float> g = {0.5f, 0.5f, -0.25f, 0.0f};
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  const std::vector<uint8_t> mask = {1, 0, 1, 1};
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), mask.data(), 4, config, 1, 1.0f);
  EXPECT_NEAR(p[0], 1.0f - 0.1f - 0.01f, 1e-6f);   // 0.89
  EXPECT_NEAR(p[1], 1.0f - 0.1f, 1e-6f);           // 0.9: mask 0, no decay
  EXPECT_NEAR(p[2], -2.0f + 0.1f + 0.02f, 1e-6f);  // -1.88
  EXPECT_NEAR(p[3], 0.5f - 0.005f, 1e-7f);         // zero gradient: decay only
  // Moments to fp32 rounding (1 - 0.9f is not exactly 0.1): relative 1e-6.
  EXPECT_NEAR(m[0], 0.05f, 0.05f * 1e-6f);
  EXPECT_NEAR(v[0], 0.0125f, 0.0125f * 1e-6f);
  EXPECT_NEAR(m[2], -0.025f, 0.025f * 1e-6f);
  EXPECT_NEAR(v[2], 0.003125f, 0.003125f * 1e-6f);
}

// The update written out in double, independently of the float implementation.
void ReferenceStep(std::vector<double>* p, const std::vector<double>& g, std::vector<double>* m,
                   std::vector<double>* v, const std::vector<uint8_t>& mask, double lr, double b1,
                   double b2, double eps, double wd, int step, double grad_scale) {
  for (size_t i = 0; i < p->size(); ++i) {
    const double gi = g[i] * grad_scale;
    (*m)[i] = b1 * (*m)[i] + (1 - b1) * gi;
    (*v)[i] = b2 * (*v)[i] + (1 - b2) * gi * gi;
    const double m_hat = (*m)[i] / (1 - std::pow(b1, step));
    const double v_hat = (*v)[i] / (1 - std::pow(b2, step));
    const double decay = mask[i] ? wd * (*p)[i] : 0.0;
    (*p)[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + decay);
  }
}

TEST(AdamWTest, SeveralStepsMatchDoubleReferenceWithGradScale) {
  const AdamWConfig config{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const size_t n = 37;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> dist;
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  std::vector<uint8_t> mask(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = dist(rng);
    mask[i] = i % 3 != 0;
  }
  std::vector<double> pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
  for (int step = 1; step <= 5; ++step) {
    std::vector<float> g(n);
    for (float& x : g) x = dist(rng);
    const float grad_scale = step % 2 ? 0.3f : 1.0f;
    AdamWUpdate(p.data(), g.data(), m.data(), v.data(), mask.data(), n, config, step, grad_scale);
    ReferenceStep(&pd, std::vector<double>(g.begin(), g.end()), &md, &vd, mask, config.lr,
                  config.beta1, config.beta2, config.eps, config.weight_decay, step, grad_scale);
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], pd[i], 1e-6 * std::max(1.0, std::abs(pd[i]))) << i;
    EXPECT_NEAR(m[i], md[i], 1e-6) << i;
    EXPECT_NEAR(v[i], vd[i], 1e-6) << i;
  }
}

TEST(AdamWTest, GradScaleEqualsScaledGradients) {
  const AdamWConfig config{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const std::vector<float> g = {0.3f, -1.5f, 2.0f, 1e-3f};
  const std::vector<float> g_half = {0.15f, -0.75f, 1.0f, 5e-4f};
  const std::vector<uint8_t> mask = {1, 1, 0, 0};
  std::vector<float> p1 = {1, 2, 3, 4}, m1(4, 0.1f), v1(4, 0.2f);
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  AdamWUpdate(p1.data(), g.data(), m1.data(), v1.data(), mask.data(), 4, config, 3, 0.5f);
  AdamWUpdate(p2.data(), g_half.data(), m2.data(), v2.data(), mask.data(), 4, config, 3, 1.0f);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
}

TEST(AdamWTest, DecayOnlyWhereMasked) {
  const AdamWConfig config{0.5f, 0.9f, 0.95f, 1e-8f, 0.2f};
  std::vector<float> p = {2.0f, 2.0f, -4.0f, -4.0f};
  const std::vector<float> g(4, 0.0f);
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  const std::vector<uint8_t> mask = {1, 0, 1, 0};
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), mask.data(), 4, config, 1, 1.0f);
  EXPECT_FLOAT_EQ(p[0], 2.0f * (1.0f - 0.5f * 0.2f));
  EXPECT_EQ(p[1], 2.0f);  // zero gradient, no decay: untouched, bit for bit
  EXPECT_FLOAT_EQ(p[2], -4.0f * (1.0f - 0.5f * 0.2f));
  EXPECT_EQ(p[3], -4.0f);
}

TEST(AdamWTest, ShardingDoesNotChangeTheResult) {
  const AdamWConfig config{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const size_t n = 101, cut = 40;
  std::mt19937_64 rng(2);
  std::normal_distribution<float> dist;
  std::vector<float> p(n), g(n), m(n), v(n);
  std::vector<uint8_t> mask(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = dist(rng);
    g[i] = dist(rng);
    m[i] = 0.1f * dist(rng);
    v[i] = std::abs(dist(rng));
    mask[i] = i % 2;
  }
  std::vector<float> p2 = p, m2 = m, v2 = v;
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), mask.data(), n, config, 7, 0.8f);
  AdamWUpdate(p2.data(), g.data(), m2.data(), v2.data(), mask.data(), cut, config, 7, 0.8f);
  AdamWUpdate(p2.data() + cut, g.data() + cut, m2.data() + cut, v2.data() + cut, mask.data() + cut,
              n - cut, config, 7, 0.8f);
  EXPECT_EQ(p, p2);
  EXPECT_EQ(m, m2);
  EXPECT_EQ(v, v2);
}

TEST(AdamWTest, ConfigFromSpecFillsDefaults) {
  weft::v1::OptimizerSpec spec;
  spec.set_learning_rate(6e-4);
  AdamWConfig c = AdamWConfigFromSpec(spec, 1e-4);
  EXPECT_FLOAT_EQ(c.lr, 1e-4f);
  EXPECT_FLOAT_EQ(c.beta1, 0.9f);
  EXPECT_FLOAT_EQ(c.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.eps, 1e-8f);
  EXPECT_FLOAT_EQ(c.weight_decay, 0.1f);
  spec.set_beta2(0.999);
  spec.set_weight_decay(0.0);  // an explicit 0 is kept, not replaced by the default
  c = AdamWConfigFromSpec(spec, 1e-4);
  EXPECT_FLOAT_EQ(c.beta2, 0.999f);
  EXPECT_EQ(c.weight_decay, 0.0f);
}

TEST(SumOfSquaresTest, MatchesKnownSums) {
  std::vector<float> x(19);
  for (int i = 0; i < 19; ++i) x[i] = static_cast<float>(i + 1);
  EXPECT_EQ(SumOfSquares(x.data(), 19), 2470.0);  // 19 * 20 * 39 / 6
  EXPECT_EQ(SumOfSquares(x.data(), 0), 0.0);
  EXPECT_EQ(SumOfSquares(x.data(), 3), 14.0);
  std::vector<float> tiny(1000, 1e-3f);
  const double t = 1e-3f;  // the float nearest 1e-3, squared in double
  EXPECT_NEAR(SumOfSquares(tiny.data(), tiny.size()), 1000 * t * t, 1e-18);
}

weft::v1::JobSpec ScheduleSpec(weft::v1::LrSchedule::Kind kind, int64_t warmup, int64_t total) {
  weft::v1::JobSpec spec;
  spec.mutable_optimizer()->set_learning_rate(1e-3);
  spec.mutable_lr_schedule()->set_kind(kind);
  spec.mutable_lr_schedule()->set_warmup_steps(warmup);
  spec.mutable_lr_schedule()->set_min_lr_ratio(0.2);
  spec.mutable_training()->set_total_steps(total);
  return spec;
}

TEST(LearningRateTest, WarmupIsLinearFromZeroToPeak) {
  const weft::v1::JobSpec spec = ScheduleSpec(weft::v1::LrSchedule::COSINE, 10, 110);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 0), 1e-4);  // (0 + 1) / 10 of the peak: never zero
  EXPECT_DOUBLE_EQ(LearningRate(spec, 4), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 9), 1e-3);  // the last warmup step reaches the peak
}

TEST(LearningRateTest, CosineDecaysFromPeakToFloorAtTotalSteps) {
  const weft::v1::JobSpec spec = ScheduleSpec(weft::v1::LrSchedule::COSINE, 10, 110);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 10), 1e-3);
  EXPECT_NEAR(LearningRate(spec, 60), 0.5 * (1e-3 + 2e-4), 1e-15);  // half way
  EXPECT_NEAR(LearningRate(spec, 110), 2e-4, 1e-15);
  EXPECT_NEAR(LearningRate(spec, 500), 2e-4, 1e-15);  // past the end: the floor
  double prev = LearningRate(spec, 10);
  for (int s = 11; s <= 110; ++s) {
    const double lr = LearningRate(spec, s);
    EXPECT_LT(lr, prev) << s;
    prev = lr;
  }
}

TEST(LearningRateTest, UnspecifiedKindIsCosineAndMinRatioDefaults) {
  weft::v1::JobSpec spec = ScheduleSpec(weft::v1::LrSchedule::KIND_UNSPECIFIED, 0, 100);
  spec.mutable_lr_schedule()->clear_min_lr_ratio();
  EXPECT_DOUBLE_EQ(LearningRate(spec, 0), 1e-3);      // no warmup: the peak at once
  EXPECT_NEAR(LearningRate(spec, 100), 1e-4, 1e-15);  // default floor 0.1
}

TEST(LearningRateTest, ConstantHoldsThePeakAfterWarmup) {
  const weft::v1::JobSpec spec = ScheduleSpec(weft::v1::LrSchedule::CONSTANT, 4, 50);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 0), 2.5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 3), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 4), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 49), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 50), 1e-3);
}

// The host step of optimizer offload: any thread count gives AdamWUpdate's values, and the bf16
// copy is each new parameter rounded to nearest even.
TEST(AdamWParallelTest, EqualsTheSerialStepAtAnyThreadCount) {
  constexpr size_t kN = 1003;  // not a multiple of the chunking
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> params(kN), grads(kN), m(kN), v(kN);
  std::vector<uint8_t> mask(kN);
  for (size_t i = 0; i < kN; ++i) {
    params[i] = normal(rng);
    grads[i] = normal(rng);
    m[i] = 0.1f * normal(rng);
    v[i] = std::abs(0.01f * normal(rng));
    mask[i] = static_cast<uint8_t>(i % 3 == 0);
  }
  AdamWConfig config;
  config.lr = 1e-3f;
  std::vector<float> want_p = params, want_m = m, want_v = v;
  AdamWUpdate(want_p.data(), grads.data(), want_m.data(), want_v.data(), mask.data(), kN, config,
              7, 0.5f);
  for (int threads : {1, 3, 16}) {
    SCOPED_TRACE(threads);
    std::vector<float> p = params, mm = m, vv = v;
    std::vector<uint16_t> bf16(kN);
    AdamWUpdateParallel(p.data(), grads.data(), mm.data(), vv.data(), mask.data(), kN, config, 7,
                        0.5f, bf16.data(), threads);
    EXPECT_EQ(p, want_p);
    EXPECT_EQ(mm, want_m);
    EXPECT_EQ(vv, want_v);
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(bf16[i], Bf16Bits(p[i])) << i;
  }
}

TEST(AdamWParallelTest, Bf16BitsRoundsToNearestEven) {
  const auto bits = [](uint32_t x) {
    float f;
    std::memcpy(&f, &x, sizeof(f));
    return Bf16Bits(f);
  };
  EXPECT_EQ(bits(0x3f800000u), 0x3f80);  // 1.0 exactly
  EXPECT_EQ(bits(0x3f808000u), 0x3f80);  // a tie, to the even 0x3f80
  EXPECT_EQ(bits(0x3f818000u), 0x3f82);  // a tie, to the even 0x3f82
  EXPECT_EQ(bits(0x3f808001u), 0x3f81);  // above the tie
  EXPECT_EQ(bits(0x3f807fffu), 0x3f80);  // below it
  EXPECT_EQ(bits(0x7f7fffffu), 0x7f80);  // the largest float rounds to infinity, as CUDA's
  EXPECT_EQ(bits(0x7fc00001u) & 0x7fc0, 0x7fc0);  // NaN stays NaN
  // A NaN whose payload is all below bf16's mantissa would round to infinity: kept a NaN.
  EXPECT_EQ(bits(0x7f800001u), 0x7fc0);
  EXPECT_EQ(bits(0xff800001u), 0xffc0);
}

}  // namespace
}  // namespace weft::engine
