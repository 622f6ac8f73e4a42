// The Llama CPU ops: gradient checks against central finite differences (harness and
// tolerances: grad_check.h) of RMSNorm, rotary embeddings (plain and llama3-scaled
// frequencies), SwiGLU, grouped-query attention, Qwen3's q/k norm and the encoder without
// positions; and the properties that pin their conventions: RMSNorm and SwiGLU by hand, the q/k
// norm as RMSNorm per head leaving v, rotary as Hugging Face pairs elements, the identity at
// position 0 and norm-preserving, GQA as MHA over repeated k/v heads and, with NKV == NH,
// bit-identical to GPT-2's attention.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/grad_check.h"
#include "worker/engine/cpu/ops.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine::cpu {
namespace {

TEST(EncoderTest, WithoutPositionsGradientsMatchFiniteDifferences) {
  const int b = 2, t = 3, c = 4, vp = 7;
  const std::vector<int32_t> tokens = {1, 3, 1, 4, 1, 0};
  std::mt19937_64 rng(31);
  const Tensors inputs = {RandomVector(rng, vp * c)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& x) {
    std::vector<T> out(b * t * c);  // (B, T, C)
    EncoderForward(out.data(), tokens.data(), x[0].data(), static_cast<const T*>(nullptr), nullptr,
                   b, t, c);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& x, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    EncoderBackward((*g)[0].data(), static_cast<T*>(nullptr), dout.data(), tokens.data(), nullptr,
                    b, t, c);
  };
  CheckOp(forward, backward, inputs, 41);
}

// ---- RMSNorm ----

TEST(RmsNormTest, GradientsMatchFiniteDifferences) {
  const int n = 3, c = 5;
  std::mt19937_64 rng(32);
  std::vector<double> x = RandomVector(rng, n * c);
  for (int i = 0; i < c; ++i) x[2 * c + i] = 20.0 + 0.5 * x[2 * c + i];  // a large-mean row
  const Tensors inputs = {x, RandomVector(rng, c, 1.0, 0.3)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(n * c), rrms(n);
    RmsNormForward(out.data(), rrms.data(), in[0].data(), in[1].data(), n, c, 1e-5);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    std::vector<T> out(n * c), rrms(n);
    RmsNormForward(out.data(), rrms.data(), in[0].data(), in[1].data(), n, c, 1e-5);
    RmsNormBackward((*g)[0].data(), (*g)[1].data(), dout.data(), in[0].data(), in[1].data(),
                    rrms.data(), n, c);
  };
  CheckOp(forward, backward, inputs, 42);
}

TEST(RmsNormTest, ScalesByTheRootMeanSquareWithoutCentering) {
  // Row [3, 4]: mean square 12.5; eps 0.5 makes the root exactly sqrt(13).
  const std::vector<double> x = {3, 4}, w = {2, -1};
  std::vector<double> out(2), rrms(1);
  RmsNormForward(out.data(), rrms.data(), x.data(), w.data(), 1, 2, 0.5);
  EXPECT_NEAR(rrms[0], 1 / std::sqrt(13.0), 1e-15);
  EXPECT_NEAR(out[0], 2 * 3 / std::sqrt(13.0), 1e-15);
  EXPECT_NEAR(out[1], -4 / std::sqrt(13.0), 1e-15);
}

// ---- Qwen3's q/k norm ----

struct QkNormShape {
  int n, nh, nkv, d;
  int heads() const { return nh + nkv; }
  int row() const { return (nh + 2 * nkv) * d; }
};
constexpr QkNormShape kQk = {3, 4, 2, 8};
constexpr double kQkEps = 1e-6;

TEST(QkNormTest, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(35);
  std::vector<double> qkv = RandomVector(rng, kQk.n * kQk.row());
  // One k head far from zero mean: the norm must not center.
  for (int j = 0; j < kQk.d; ++j) qkv[(kQk.nh + 1) * kQk.d + j] += 6.0;
  const Tensors inputs = {qkv, RandomVector(rng, kQk.d, 1.0, 0.3),
                          RandomVector(rng, kQk.d, 1.0, 0.3)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out = in[0], raw(kQk.n * kQk.heads() * kQk.d), rrms(kQk.n * kQk.heads());
    QkNormForward(out.data(), raw.data(), rrms.data(), in[1].data(), in[2].data(), kQk.n, kQk.nh,
                  kQk.nkv, kQk.d, kQkEps);
    return out;
  };
  // QkNormBackward transforms in place (=); the harness wants accumulation, so add its result
  // (v's part passes through untouched: v is the identity).
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    std::vector<T> out = in[0], raw(kQk.n * kQk.heads() * kQk.d), rrms(kQk.n * kQk.heads());
    QkNormForward(out.data(), raw.data(), rrms.data(), in[1].data(), in[2].data(), kQk.n, kQk.nh,
                  kQk.nkv, kQk.d, kQkEps);
    std::vector<T> d = dout;
    QkNormBackward(d.data(), (*g)[1].data(), (*g)[2].data(), raw.data(), rrms.data(), in[1].data(),
                   in[2].data(), kQk.n, kQk.nh, kQk.nkv, kQk.d);
    for (size_t i = 0; i < d.size(); ++i) (*g)[0][i] += d[i];
  };
  CheckOp(forward, backward, inputs, 135);
}

// Each q head is RmsNormForward with q_weight, each k head with k_weight, bit for bit; v and
// dv pass untouched and qk_raw is the input's q | k.
TEST(QkNormTest, IsRmsNormPerHeadAndLeavesV) {
  std::mt19937_64 rng(36);
  const std::vector<double> x = RandomVector(rng, kQk.n * kQk.row());
  const std::vector<double> wq = RandomVector(rng, kQk.d), wk = RandomVector(rng, kQk.d);
  std::vector<double> y = x, raw(kQk.n * kQk.heads() * kQk.d, -1), rrms(kQk.n * kQk.heads(), -1);
  QkNormForward(y.data(), raw.data(), rrms.data(), wq.data(), wk.data(), kQk.n, kQk.nh, kQk.nkv,
                kQk.d, kQkEps);
  for (int i = 0; i < kQk.n; ++i) {
    for (int h = 0; h < kQk.nh + 2 * kQk.nkv; ++h) {
      const size_t at = static_cast<size_t>(i) * kQk.row() + h * kQk.d;
      std::vector<double> want(x.begin() + at, x.begin() + at + kQk.d);
      if (h < kQk.heads()) {
        const size_t slot = static_cast<size_t>(i) * kQk.heads() + h;
        for (int j = 0; j < kQk.d; ++j) EXPECT_EQ(raw[slot * kQk.d + j], x[at + j]);
        double r = 0;
        RmsNormForward(want.data(), &r, x.data() + at, h < kQk.nh ? wq.data() : wk.data(), 1, kQk.d,
                       kQkEps);
        EXPECT_EQ(rrms[slot], r);
      }
      for (int j = 0; j < kQk.d; ++j) EXPECT_EQ(y[at + j], want[j]) << "row " << i << " head " << h;
    }
  }
  std::vector<double> d = x, dwq(kQk.d), dwk(kQk.d);
  QkNormBackward(d.data(), dwq.data(), dwk.data(), raw.data(), rrms.data(), wq.data(), wk.data(),
                 kQk.n, kQk.nh, kQk.nkv, kQk.d);
  for (int i = 0; i < kQk.n; ++i) {
    for (int j = kQk.heads() * kQk.d; j < kQk.row(); ++j) {
      EXPECT_EQ(d[i * kQk.row() + j], x[i * kQk.row() + j]) << "dv of row " << i;
    }
  }
}

// ---- rotary ----

constexpr int kB = 2, kT = 5, kNh = 4, kNkv = 2, kD = 8;
constexpr int kRow = (kNh + 2 * kNkv) * kD;

// inv_freq 1, 0.1, 0.01, 0.001: wavelengths 6.3, 63, 628, 6283. With an original context of
// 64, low 1 and high 4 (bands at 64 and 16), the first is kept, the second blended and the
// other two divided by the factor: every branch of the scaling is exercised.
LlamaConfig RopeConfig(bool llama3) {
  return LlamaConfig{.hidden_size = kNh * kD,
                     .num_heads = kNh,
                     .rope_theta = 10000.0,
                     .rope_llama3 = llama3,
                     .rope_factor = 8,
                     .rope_low_freq_factor = 1,
                     .rope_high_freq_factor = 4,
                     .rope_original_context_length = 64};
}

template <typename T>
struct RopeTablesOf {
  std::vector<T> cos, sin;
  RopeTablesOf(const LlamaConfig& config, int t) : cos(t * kD / 2), sin(t * kD / 2) {
    const std::vector<double> inv_freq = RopeInverseFrequencies(config);
    RopeTables(cos.data(), sin.data(), inv_freq.data(), t, kD);
  }
};

void CheckRopeGradient(bool llama3, uint64_t seed) {
  const LlamaConfig config = RopeConfig(llama3);
  std::mt19937_64 rng(seed);
  const Tensors inputs = {RandomVector(rng, kB * kT * kRow)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    const RopeTablesOf<T> tables(config, kT);
    std::vector<T> qkv = in[0];
    RopeForward(qkv.data(), tables.cos.data(), tables.sin.data(), nullptr, kB, kT, kNh, kNkv, kD);
    return qkv;
  };
  // RopeBackward transforms in place (=); the harness wants accumulation, so add its result.
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    const RopeTablesOf<T> tables(config, kT);
    std::vector<T> d = dout;
    RopeBackward(d.data(), tables.cos.data(), tables.sin.data(), nullptr, kB, kT, kNh, kNkv, kD);
    for (size_t i = 0; i < d.size(); ++i) (*g)[0][i] += d[i];
  };
  CheckOp(forward, backward, inputs, seed + 100);
}

TEST(RopeTest, GradientsMatchFiniteDifferences) { CheckRopeGradient(false, 33); }

TEST(RopeTest, GradientsMatchFiniteDifferencesWithLlama3Scaling) {
  const std::vector<double> plain = RopeInverseFrequencies(RopeConfig(false));
  const std::vector<double> scaled = RopeInverseFrequencies(RopeConfig(true));
  ASSERT_EQ(scaled.size(), 4u);
  EXPECT_EQ(scaled[0], plain[0]);
  EXPECT_LT(scaled[1], plain[1]);
  EXPECT_GT(scaled[1], plain[1] / 8);
  EXPECT_NEAR(scaled[3], plain[3] / 8, 1e-18);
  CheckRopeGradient(true, 34);
}

TEST(RopeTest, PairsElementIWithIPlusHalfHeadAsHuggingFace) {
  LlamaConfig config = RopeConfig(false);
  const std::vector<double> inv_freq = RopeInverseFrequencies(config);
  const int t = 3;
  const RopeTablesOf<double> tables(config, t);
  std::mt19937_64 rng(35);
  const std::vector<double> x = RandomVector(rng, t * kRow);
  std::vector<double> y = x;
  RopeForward(y.data(), tables.cos.data(), tables.sin.data(), nullptr, 1, t, kNh, kNkv, kD);
  for (int pos = 0; pos < t; ++pos) {
    // Query heads and key heads rotate alike; value heads are untouched.
    for (int head = 0; head < kNh + kNkv; ++head) {
      const int base = pos * kRow + head * kD;
      for (int i = 0; i < kD / 2; ++i) {
        const double angle = pos * inv_freq[i];
        const double x1 = x[base + i], x2 = x[base + i + kD / 2];
        EXPECT_NEAR(y[base + i], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-15);
        EXPECT_NEAR(y[base + i + kD / 2], x2 * std::cos(angle) + x1 * std::sin(angle), 1e-15);
      }
    }
    for (int i = (kNh + kNkv) * kD; i < kRow; ++i) EXPECT_EQ(y[pos * kRow + i], x[pos * kRow + i]);
  }
}

TEST(RopeTest, IsTheIdentityAtPositionZeroAndKeepsNorms) {
  const RopeTablesOf<float> tables(RopeConfig(true), kT);
  std::mt19937_64 rng(36);
  const std::vector<double> xd = RandomVector(rng, kT * kRow);
  const std::vector<float> x(xd.begin(), xd.end());
  std::vector<float> y = x;
  RopeForward(y.data(), tables.cos.data(), tables.sin.data(), nullptr, 1, kT, kNh, kNkv, kD);
  for (int i = 0; i < kRow; ++i) EXPECT_EQ(y[i], x[i]) << "position 0, element " << i;
  for (int pos = 1; pos < kT; ++pos) {
    for (int head = 0; head < kNh + kNkv; ++head) {
      const int base = pos * kRow + head * kD;
      for (int i = 0; i < kD / 2; ++i) {
        const double before = std::hypot(x[base + i], x[base + i + kD / 2]);
        const double after = std::hypot(y[base + i], y[base + i + kD / 2]);
        EXPECT_NEAR(after, before, 1e-6 * before) << "position " << pos << " head " << head;
      }
    }
  }
  // The backward is the inverse rotation: it brings the rotated values back.
  RopeBackward(y.data(), tables.cos.data(), tables.sin.data(), nullptr, 1, kT, kNh, kNkv, kD);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-6) << i;
}

// ---- SwiGLU ----

TEST(SwiGluTest, GradientsMatchFiniteDifferences) {
  const int n = 3, inter = 4;
  std::mt19937_64 rng(37);
  std::vector<double> x = RandomVector(rng, n * 2 * inter, 0.0, 2.0);
  x[0] = -9.0;  // deep in silu's negative tail
  x[1] = 7.5;
  const Tensors inputs = {x};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(n * inter);
    SwiGluForward(out.data(), in[0].data(), n, inter);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    SwiGluBackward((*g)[0].data(), dout.data(), in[0].data(), n, inter);
  };
  CheckOp(forward, backward, inputs, 47);
}

TEST(SwiGluTest, IsSiluOfGateTimesUp) {
  // Row [gate | up] = [1, -2 | 3, 0.5]: silu(1) * 3 and silu(-2) * 0.5.
  const std::vector<double> x = {1, -2, 3, 0.5};
  std::vector<double> out(2);
  SwiGluForward(out.data(), x.data(), 1, 2);
  EXPECT_NEAR(out[0], 3 * 1 / (1 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(out[1], 0.5 * -2 / (1 + std::exp(2.0)), 1e-15);
}

// ---- grouped-query attention ----

void CheckGqaGradient(int nh, int nkv, uint64_t seed, int window = 0, int t = 4) {
  const int b = 2, d = 4;
  const int row = (nh + 2 * nkv) * d;
  std::mt19937_64 rng(seed);
  const Tensors inputs = {RandomVector(rng, b * t * row)};
  auto forward = [&]<typename T>(const std::vector<std::vector<T>>& in) {
    std::vector<T> out(b * t * nh * d), att(b * nh * t * t);
    GqaAttentionForward(out.data(), att.data(), in[0].data(), nullptr, window, b, t, nh, nkv, d);
    return out;
  };
  auto backward = [&]<typename T>(const std::vector<std::vector<T>>& in, const std::vector<T>& dout,
                                  std::vector<std::vector<T>>* g) {
    std::vector<T> out(b * t * nh * d), att(b * nh * t * t), scratch(t * t);
    GqaAttentionForward(out.data(), att.data(), in[0].data(), nullptr, window, b, t, nh, nkv, d);
    GqaAttentionBackward((*g)[0].data(), scratch.data(), dout.data(), in[0].data(), att.data(),
                         nullptr, window, b, t, nh, nkv, d);
  };
  CheckOp(forward, backward, inputs, seed + 100);
}

TEST(GqaAttentionTest, GradientsMatchFiniteDifferencesGrouped) { CheckGqaGradient(4, 2, 38); }
TEST(GqaAttentionTest, GradientsMatchFiniteDifferencesOneKvHead) { CheckGqaGradient(3, 1, 39); }
TEST(GqaAttentionTest, GradientsMatchFiniteDifferencesAsManyKvHeads) { CheckGqaGradient(2, 2, 40); }
TEST(GqaAttentionTest, GradientsMatchFiniteDifferencesInASlidingWindow) {
  CheckGqaGradient(4, 2, 41, /*window=*/3, /*t=*/7);
}

// A window w keeps query i's keys (i - w, i]: zero probability before them, a softmax over
// exactly them, and a window of T or more is plain causal attention bit for bit.
TEST(GqaAttentionTest, SlidingWindowSeesOnlyTheLastWindowKeys) {
  const int b = 1, t = 9, nh = 2, nkv = 1, d = 4, w = 3;
  const int row = (nh + 2 * nkv) * d;
  std::mt19937_64 rng(45);
  const std::vector<double> qkv = RandomVector(rng, b * t * row);
  std::vector<double> out(b * t * nh * d), att(b * nh * t * t);
  GqaAttentionForward(out.data(), att.data(), qkv.data(), nullptr, w, b, t, nh, nkv, d);
  for (int h = 0; h < nh; ++h) {
    for (int i = 0; i < t; ++i) {
      double sum = 0;
      for (int j = 0; j < t; ++j) {
        const double p = att[(h * t + i) * t + j];
        if (j <= i - w || j > i) {
          EXPECT_EQ(p, 0.0) << "h " << h << " i " << i << " j " << j;
        } else {
          // Against the scores computed here: p_j = exp(s_j) / sum over the window.
          auto score = [&](int k) {
            double s = 0;
            for (int x = 0; x < d; ++x) s += qkv[i * row + h * d + x] * qkv[k * row + nh * d + x];
            return s / std::sqrt(static_cast<double>(d));
          };
          double z = 0;
          for (int k = std::max(0, i - w + 1); k <= i; ++k) z += std::exp(score(k));
          EXPECT_NEAR(p, std::exp(score(j)) / z, 1e-12) << "i " << i << " j " << j;
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
  }
  std::vector<double> out_wide(out.size()), att_wide(att.size()), out_causal(out.size()),
      att_causal(att.size());
  GqaAttentionForward(out_wide.data(), att_wide.data(), qkv.data(), nullptr, t, b, t, nh, nkv, d);
  GqaAttentionForward(out_causal.data(), att_causal.data(), qkv.data(), nullptr, 0, b, t, nh, nkv,
                      d);
  EXPECT_EQ(out_wide, out_causal);
  EXPECT_EQ(att_wide, att_causal);
}

TEST(GqaAttentionTest, WithAsManyKvHeadsIsBitIdenticalToMultiHeadAttention) {
  const int b = 2, t = 5, nh = 3, d = 4, c = nh * d;
  std::mt19937_64 rng(43);
  const std::vector<double> qkvd = RandomVector(rng, b * t * 3 * c);
  const std::vector<float> qkv(qkvd.begin(), qkvd.end());
  std::vector<float> out_g(b * t * c), att_g(b * nh * t * t), out_m(out_g.size()),
      att_m(att_g.size());
  GqaAttentionForward(out_g.data(), att_g.data(), qkv.data(), nullptr, 0, b, t, nh, nh, d);
  AttentionForward(out_m.data(), att_m.data(), qkv.data(), nullptr, b, t, c, nh);
  EXPECT_EQ(out_g, out_m);
  EXPECT_EQ(att_g, att_m);
  const std::vector<double> doutd = RandomVector(rng, out_g.size());
  const std::vector<float> dout(doutd.begin(), doutd.end());
  std::vector<float> dqkv_g(qkv.size(), 0.5f), dqkv_m(qkv.size(), 0.5f), scratch(t * t);
  GqaAttentionBackward(dqkv_g.data(), scratch.data(), dout.data(), qkv.data(), att_g.data(),
                       nullptr, 0, b, t, nh, nh, d);
  AttentionBackward(dqkv_m.data(), scratch.data(), dout.data(), qkv.data(), att_m.data(), nullptr,
                    b, t, c, nh);
  EXPECT_EQ(dqkv_g, dqkv_m);
}

// Query head h reads kv head h / (NH / NKV): the same as multi-head attention over k/v heads
// repeated in that order (what Hugging Face's repeat_kv builds), and a shared head's gradient
// is the sum of its copies' gradients.
TEST(GqaAttentionTest, EqualsMultiHeadAttentionOverRepeatedKvHeads) {
  const int b = 2, t = 4, nh = 4, nkv = 2, d = 4, group = nh / nkv;
  const int row = (nh + 2 * nkv) * d, c = nh * d;
  std::mt19937_64 rng(44);
  const std::vector<double> qkv = RandomVector(rng, b * t * row);
  std::vector<double> rep(b * t * 3 * c);  // (B, T, 3C) with k/v heads repeated
  for (int p = 0; p < b * t; ++p) {
    for (int h = 0; h < nh; ++h) {
      for (int i = 0; i < d; ++i) {
        const int kv = h / group;
        rep[p * 3 * c + h * d + i] = qkv[p * row + h * d + i];
        rep[p * 3 * c + c + h * d + i] = qkv[p * row + c + kv * d + i];
        rep[p * 3 * c + 2 * c + h * d + i] = qkv[p * row + c + nkv * d + kv * d + i];
      }
    }
  }
  std::vector<double> out_g(b * t * c), att_g(b * nh * t * t), out_m(out_g.size()),
      att_m(att_g.size());
  GqaAttentionForward(out_g.data(), att_g.data(), qkv.data(), nullptr, 0, b, t, nh, nkv, d);
  AttentionForward(out_m.data(), att_m.data(), rep.data(), nullptr, b, t, c, nh);
  for (size_t i = 0; i < out_g.size(); ++i) EXPECT_NEAR(out_g[i], out_m[i], 1e-14) << i;

  const std::vector<double> dout = RandomVector(rng, out_g.size());
  std::vector<double> dqkv(qkv.size(), 0.0), drep(rep.size(), 0.0), scratch(t * t);
  GqaAttentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att_g.data(), nullptr,
                       0, b, t, nh, nkv, d);
  AttentionBackward(drep.data(), scratch.data(), dout.data(), rep.data(), att_m.data(), nullptr, b,
                    t, c, nh);
  for (int p = 0; p < b * t; ++p) {
    for (int i = 0; i < c; ++i) EXPECT_NEAR(dqkv[p * row + i], drep[p * 3 * c + i], 1e-14) << "dq";
    for (int kv = 0; kv < nkv; ++kv) {
      for (int i = 0; i < d; ++i) {
        double dk = 0, dv = 0;
        for (int h = kv * group; h < (kv + 1) * group; ++h) {
          dk += drep[p * 3 * c + c + h * d + i];
          dv += drep[p * 3 * c + 2 * c + h * d + i];
        }
        EXPECT_NEAR(dqkv[p * row + c + kv * d + i], dk, 1e-14);
        EXPECT_NEAR(dqkv[p * row + c + nkv * d + kv * d + i], dv, 1e-14);
      }
    }
  }
}

}  // namespace
}  // namespace weft::engine::cpu
