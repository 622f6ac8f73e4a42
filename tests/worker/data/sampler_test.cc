#include "worker/data/sampler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/random.h"

namespace weft::data {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Empirical distribution of `n` draws.
std::vector<double> Frequencies(const std::vector<float>& logits, float temperature, int top_k,
                                int n, uint64_t seed = 1) {
  std::vector<double> freq(logits.size(), 0.0);
  uint64_t state = seed;
  for (int i = 0; i < n; ++i) {
    const int32_t t = SampleToken(logits.data(), static_cast<int>(logits.size()), temperature,
                                  top_k, &state);
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(logits.size()));
    freq[t] += 1.0 / n;
  }
  return freq;
}

// 100k draws: the standard error of a frequency is <= 0.0016, so 0.01 is a > 6-sigma bound and
// the test is deterministic anyway (fixed seed).
constexpr int kDraws = 100000;
constexpr double kTolerance = 0.01;

void ExpectNear(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], kTolerance) << "token " << i;
  }
}

std::vector<float> LogProbs(const std::vector<double>& p) {
  std::vector<float> logits;
  for (double x : p) logits.push_back(static_cast<float>(std::log(x)));
  return logits;
}

TEST(RandomTest, SplitMix64MatchesTheReferenceSequence) {
  // Reference outputs of splitmix64 seeded with 0 (Vigna's splitmix64.c).
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64Next(&state), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(SplitMix64Next(&state), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(SplitMix64Next(&state), 0x06C45D188009454FULL);
}

TEST(SampleTokenTest, TemperatureZeroIsArgmax) {
  uint64_t state = 3;
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f, 2.0f};
  for (int top_k : {0, 2, 5}) {
    // Ties go to the lower index.
    EXPECT_EQ(SampleToken(logits.data(), 5, 0.0f, top_k, &state), 1);
  }
  // Random logits: always the maximum.
  uint64_t gen = 99;
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<float> l(257);
    for (float& x : l) x = static_cast<float>(UniformDouble(&gen) * 20 - 10);
    const int32_t expected = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    EXPECT_EQ(SampleToken(l.data(), 257, 0.0f, 0, &state), expected);
  }
}

TEST(SampleTokenTest, TopKOneIsArgmaxAtAnyTemperature) {
  uint64_t state = 3;
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f};
  for (float temperature : {0.5f, 1.0f, 100.0f}) {
    for (int i = 0; i < 100; ++i) EXPECT_EQ(SampleToken(logits.data(), 4, temperature, 1, &state), 1);
  }
}

TEST(SampleTokenTest, FrequenciesMatchTheSoftmax) {
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  ExpectNear(Frequencies(LogProbs(p), 1.0f, 0, kDraws), p);
}

TEST(SampleTokenTest, TemperatureFlattensAndSharpens) {
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  // T = 2: p^(1/2), renormalized.
  std::vector<double> flat;
  double sum = 0;
  for (double x : p) sum += std::sqrt(x);
  for (double x : p) flat.push_back(std::sqrt(x) / sum);
  ExpectNear(Frequencies(LogProbs(p), 2.0f, 0, kDraws), flat);
  // T = 0.5: p^2, renormalized.
  std::vector<double> sharp;
  sum = 0;
  for (double x : p) sum += x * x;
  for (double x : p) sharp.push_back(x * x / sum);
  ExpectNear(Frequencies(LogProbs(p), 0.5f, 0, kDraws), sharp);
}

TEST(SampleTokenTest, TopKRenormalizesOverTheKLargest) {
  const std::vector<double> p = {0.3, 0.1, 0.4, 0.2};
  // k = 2 keeps tokens 2 and 0: 4/7 and 3/7.
  ExpectNear(Frequencies(LogProbs(p), 1.0f, 2, kDraws), {3.0 / 7, 0, 4.0 / 7, 0});
  // k >= vocab is the same as no limit.
  ExpectNear(Frequencies(LogProbs(p), 1.0f, 4, kDraws), p);
  ExpectNear(Frequencies(LogProbs(p), 1.0f, 100, kDraws), p);
}

TEST(SampleTokenTest, TopKTiesBreakTowardLowerIndex) {
  // Four equal logits, k = 2: exactly tokens 0 and 1, half each.
  ExpectNear(Frequencies({1.0f, 1.0f, 1.0f, 1.0f}, 1.0f, 2, kDraws), {0.5, 0.5, 0, 0});
}

TEST(SampleTokenTest, NumericallySafeForExtremeLogits) {
  // exp(1000) overflows float and double; the max-shifted softmax does not.
  ExpectNear(Frequencies({1000.0f, 1001.0f}, 1.0f, 0, kDraws),
             {1 / (1 + std::exp(1.0)), std::exp(1.0) / (1 + std::exp(1.0))});
  ExpectNear(Frequencies({-1000.0f, -1001.0f}, 1.0f, 0, kDraws),
             {std::exp(1.0) / (1 + std::exp(1.0)), 1 / (1 + std::exp(1.0))});
  // A tiny temperature is greedy in effect, without NaN.
  ExpectNear(Frequencies({1.0f, 1.001f, 0.0f}, 1e-30f, 0, 1000), {0, 1, 0});
}

TEST(SampleTokenTest, MaskedAndNanLogitsAreNeverDrawn) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ExpectNear(Frequencies({-kInf, 0.0f, nan, 0.0f}, 1.0f, 0, kDraws), {0, 0.5, 0, 0.5});
  ExpectNear(Frequencies({-kInf, 0.0f, nan, 0.0f}, 1.0f, 3, kDraws), {0, 0.5, 0, 0.5});
  // Degenerate: all masked -> argmax (index 0); one +inf -> that token.
  uint64_t state = 0;
  std::vector<float> all_masked = {-kInf, -kInf, -kInf};
  EXPECT_EQ(SampleToken(all_masked.data(), 3, 1.0f, 0, &state), 0);
  std::vector<float> plus_inf = {0.0f, kInf, 1.0f};
  EXPECT_EQ(SampleToken(plus_inf.data(), 3, 1.0f, 0, &state), 1);
}

TEST(SampleTokenTest, DeterministicAndOneRngStepPerCall) {
  std::vector<float> logits(1000);
  uint64_t gen = 5;
  for (float& x : logits) x = static_cast<float>(UniformDouble(&gen) * 4);
  uint64_t a = 1234, b = 1234;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(SampleToken(logits.data(), 1000, 0.8f, 50, &a),
              SampleToken(logits.data(), 1000, 0.8f, 50, &b));
  }
  // Greedy, top-k and full sampling all advance the state by exactly one splitmix64 step.
  for (auto [temperature, top_k] : {std::pair{0.0f, 0}, {1.0f, 1}, {1.0f, 0}, {0.7f, 10}}) {
    uint64_t state = 77, reference = 77;
    SampleToken(logits.data(), 1000, temperature, top_k, &state);
    SplitMix64Next(&reference);
    EXPECT_EQ(state, reference) << "temperature " << temperature << " top_k " << top_k;
  }
}

TEST(CheckSamplingParamsTest, AcceptsValid) {
  EXPECT_TRUE(CheckSamplingParams(0.0f, 0, 1, 256).ok());
  EXPECT_TRUE(CheckSamplingParams(1.5f, 256, 1000, 256).ok());
}

TEST(CheckSamplingParamsTest, NamesEachBadParameter) {
  auto message = [](float t, int k, int n, int v) {
    const absl::Status s = CheckSamplingParams(t, k, n, v);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_EQ(message(-1.0f, 0, 10, 256), "--temperature must be >= 0, got -1");
  EXPECT_THAT(message(std::numeric_limits<float>::quiet_NaN(), 0, 10, 256),
              HasSubstr("--temperature must be a finite number >= 0, got nan"));
  EXPECT_THAT(message(kInf, 0, 10, 256), HasSubstr("got inf"));
  EXPECT_EQ(message(1.0f, -2, 10, 256), "--top-k must be >= 0 (0 = no limit), got -2");
  EXPECT_EQ(message(1.0f, 300, 10, 256),
            "--top-k must be <= the vocabulary size 256 (0 = no limit), got 300");
  EXPECT_EQ(message(1.0f, 0, 0, 256), "--tokens must be >= 1, got 0");
  EXPECT_EQ(message(1.0f, 0, 10, 0), "vocabulary size must be >= 1, got 0");
  // Every violation at once, one per line.
  EXPECT_EQ(message(-0.5f, -1, -3, 256),
            "--temperature must be >= 0, got -0.5\n"
            "--top-k must be >= 0 (0 = no limit), got -1\n"
            "--tokens must be >= 1, got -3");
}

}  // namespace
}  // namespace weft::data
