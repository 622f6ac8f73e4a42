// FlashAttentionForward / FlashAttentionBackward (worker/engine/cuda/flash_attention.cu)
// against a host reference of causal attention, in double, on the same bf16-rounded inputs.
// The kernels work on the model's layouts: q, k, v read from qkv (B, T, 3C) (rows [q | k | v],
// head h owning channels [h * HS, (h + 1) * HS) of each C block, as AttentionSplitHeads), y and
// dy (B, T, C), dq, dk, dv written into dqkv (B, T, 3C); the reference works per head on its
// own (B, NH, T, HS) copies, and every element of y and dqkv (prefilled with garbage) is
// compared, so a missed or misplaced write shows.
//
// Error metric per tensor: max_i |gpu_i - ref_i| / max_i |ref_i|. What the kernels round:
// P to bf16 before P @ V (and P, dS before the backward's products), the outputs to bf16, and
// D = rowsum(dy * y) is taken from the bf16 y. Tolerances:
//  - y, dq, dk, dv: 1e-2 (bf16 P, dS and output rounding, 2^-9 each; seen on an H100: at most
//    2.5e-3 for y and dv, 4.4e-3 for dq and dk, where dS = P * (dP - D) follows a cancellation);
//  - lse: 1e-5 relative to the largest |lse| (fp32 online softmax vs double; seen 1.3e-7).
// Shapes cover ragged last tiles (T = 1, 77, 100, 520, 65 with the 32-wide HS = 128 walk),
// T = 1024 with B * NH = 2, and every supported head size (16, 32, 64, 128); the backward is
// checked bit-deterministic.
// A timing test prints the GPT-2 124M shape (B = 16, NH = 12, T = 1024, HS = 64).
// Skips (GTEST_SKIP) when no CUDA device is present, except the argument checks, which fail
// before touching the GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/engine/cuda/cuda_test_util.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using test_util::DeviceBuffer;
using test_util::FromBf16Bits;
using test_util::kGarbageBits;
using test_util::ToBf16Bits;

constexpr double kTolY = 1e-2;
constexpr double kTolDv = 1e-2;
constexpr double kTolDqDk = 1e-2;
constexpr double kTolLse = 1e-5;

bf16* AsBf16(DeviceBuffer<uint16_t>& buf) { return reinterpret_cast<bf16*>(buf.get()); }

struct Shape {
  int b, nh, t, hs;
  int c() const { return nh * hs; }
  size_t heads() const { return static_cast<size_t>(b) * nh; }
  size_t elems() const { return heads() * t * hs; }  // of one (B, T, C) tensor
};

// Head `which` (0 = q, 1 = k, 2 = v; 0 for a (B, T, C) tensor) of rows (B, T, width * C) as
// (B, NH, T, HS): out[((b * NH + h) * T + t) * HS + d] = rows[(b * T + t) * width * C +
// which * C + h * HS + d].
template <typename T>
std::vector<T> ToHeads(const std::vector<T>& rows, const Shape& s, int width, int which) {
  const size_t row_len = static_cast<size_t>(width) * s.c();
  EXPECT_EQ(rows.size(), static_cast<size_t>(s.b) * s.t * row_len);
  std::vector<T> out(s.elems());
  for (int b = 0; b < s.b; ++b) {
    for (int h = 0; h < s.nh; ++h) {
      for (int t = 0; t < s.t; ++t) {
        const size_t src =
            (static_cast<size_t>(b) * s.t + t) * row_len + static_cast<size_t>(which) * s.c() +
            static_cast<size_t>(h) * s.hs;
        const size_t dst = ((static_cast<size_t>(b) * s.nh + h) * s.t + t) * s.hs;
        for (int d = 0; d < s.hs; ++d) out[dst + d] = rows[src + d];
      }
    }
  }
  return out;
}

// Random bf16 bits for values ~ N(0, sigma) (the values the reference uses are exactly these).
std::vector<uint16_t> RandomBf16(size_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = ToBf16Bits(dist(rng));
  return out;
}

std::vector<double> ToDouble(const std::vector<uint16_t>& bits) {
  std::vector<double> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = FromBf16Bits(bits[i]);
  return out;
}

struct Reference {
  std::vector<double> y, lse, dq, dk, dv;
};

// Causal attention per head, straight from the definition, in double.
Reference ComputeReference(const Shape& s, const std::vector<double>& q,
                           const std::vector<double>& k, const std::vector<double>& v,
                           const std::vector<double>& dy) {
  const int t = s.t, hs = s.hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Reference ref;
  ref.y.assign(s.elems(), 0.0);
  ref.lse.assign(s.heads() * t, 0.0);
  ref.dq.assign(s.elems(), 0.0);
  ref.dk.assign(s.elems(), 0.0);
  ref.dv.assign(s.elems(), 0.0);
  std::vector<double> p(t), dp(t);
  for (size_t h = 0; h < s.heads(); ++h) {
    const size_t base = h * t * hs;
    const auto row = [&](const std::vector<double>& m, int i) { return &m[base + i * hs]; };
    for (int i = 0; i < t; ++i) {
      double mx = -INFINITY;
      for (int j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int d = 0; d < hs; ++d) dot += row(q, i)[d] * row(k, j)[d];
        p[j] = scale * dot;
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
      const double lse = mx + std::log(sum);
      ref.lse[h * t + i] = lse;
      double dsum = 0.0;
      for (int j = 0; j <= i; ++j) {
        p[j] = std::exp(p[j] - lse);
        double dot = 0.0;
        for (int d = 0; d < hs; ++d) {
          ref.y[base + i * hs + d] += p[j] * row(v, j)[d];
          dot += row(dy, i)[d] * row(v, j)[d];
        }
        dp[j] = dot;
        dsum += p[j] * dot;
      }
      for (int j = 0; j <= i; ++j) {
        const double ds = scale * p[j] * (dp[j] - dsum);
        for (int d = 0; d < hs; ++d) {
          ref.dq[base + i * hs + d] += ds * row(k, j)[d];
          ref.dk[base + j * hs + d] += ds * row(q, i)[d];
          ref.dv[base + j * hs + d] += p[j] * row(dy, i)[d];
        }
      }
    }
  }
  return ref;
}

// max |gpu - ref| / max |ref|.
template <typename T>
double RelError(const std::vector<T>& gpu, const std::vector<double>& ref) {
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double g;
    if constexpr (std::is_same_v<T, uint16_t>) {
      g = FromBf16Bits(gpu[i]);
    } else {
      g = gpu[i];
    }
    err = std::max(err, std::abs(g - ref[i]));
    if (!std::isfinite(g)) err = INFINITY;
    mag = std::max(mag, std::abs(ref[i]));
  }
  return err / std::max(mag, 1e-30);
}

class FlashAttentionTest : public test_util::CudaStreamTest {
 protected:
  FlashAttentionTest() : CudaStreamTest("flash attention") {}
};

class FlashAttentionShapeTest : public FlashAttentionTest,
                                public ::testing::WithParamInterface<Shape> {};

TEST_P(FlashAttentionShapeTest, MatchesHostReference) {
  const Shape s = GetParam();
  std::mt19937 rng(1234 + s.t * 7 + s.hs);
  // q, k ~ N(0, 1): scores of O(1) with a wide spread of softmax weights.
  const auto qkv = RandomBf16(3 * s.elems(), 1.0f, rng);  // (B, T, 3C)
  const auto dy = RandomBf16(s.elems(), 1.0f, rng);       // (B, T, C)
  const Reference ref =
      ComputeReference(s, ToDouble(ToHeads(qkv, s, 3, 0)), ToDouble(ToHeads(qkv, s, 3, 1)),
                       ToDouble(ToHeads(qkv, s, 3, 2)), ToDouble(ToHeads(dy, s, 1, 0)));

  DeviceBuffer<uint16_t> d_qkv(qkv), d_dy(dy);
  DeviceBuffer<uint16_t> d_y(std::vector<uint16_t>(s.elems(), kGarbageBits));
  DeviceBuffer<uint16_t> d_dqkv(std::vector<uint16_t>(3 * s.elems(), kGarbageBits));
  DeviceBuffer<float> d_lse(std::vector<float>(s.heads() * s.t, -1.0f));
  DeviceBuffer<float> d_scratch(
      std::vector<float>(FlashAttentionBackwardScratchFloats(s.b, s.nh, s.t, s.hs), 0.0f));

  ASSERT_TRUE(FlashAttentionSupported(s.hs));
  ASSERT_TRUE(FlashAttentionForward(AsBf16(d_y), d_lse.get(), AsBf16(d_qkv), s.b, s.nh, s.t,
                                    s.hs, stream_)
                  .ok());
  ASSERT_TRUE(FlashAttentionBackward(AsBf16(d_dqkv), AsBf16(d_dy), AsBf16(d_y), d_lse.get(),
                                     AsBf16(d_qkv), d_scratch.get(), s.b, s.nh, s.t, s.hs,
                                     stream_)
                  .ok());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  const auto dqkv1 = d_dqkv.ToHost();

  const double e_y = RelError(ToHeads(d_y.ToHost(), s, 1, 0), ref.y);
  const double e_lse = RelError(d_lse.ToHost(), ref.lse);
  const double e_dq = RelError(ToHeads(dqkv1, s, 3, 0), ref.dq);
  const double e_dk = RelError(ToHeads(dqkv1, s, 3, 1), ref.dk);
  const double e_dv = RelError(ToHeads(dqkv1, s, 3, 2), ref.dv);
  std::printf("B=%d NH=%d T=%d HS=%d: y %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", s.b, s.nh,
              s.t, s.hs, e_y, e_lse, e_dq, e_dk, e_dv);
  EXPECT_LE(e_y, kTolY);
  EXPECT_LE(e_lse, kTolLse);
  EXPECT_LE(e_dq, kTolDqDk);
  EXPECT_LE(e_dk, kTolDqDk);
  EXPECT_LE(e_dv, kTolDv);

  // Deterministic: a second backward, into a freshly garbage-filled dqkv, gives the same bits.
  DeviceBuffer<uint16_t> d_dqkv2(std::vector<uint16_t>(3 * s.elems(), kGarbageBits));
  ASSERT_TRUE(FlashAttentionBackward(AsBf16(d_dqkv2), AsBf16(d_dy), AsBf16(d_y), d_lse.get(),
                                     AsBf16(d_qkv), d_scratch.get(), s.b, s.nh, s.t, s.hs,
                                     stream_)
                  .ok());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(d_dqkv2.ToHost(), dqkv1);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionShapeTest,
    ::testing::Values(Shape{1, 1, 1, 64}, Shape{1, 2, 100, 64}, Shape{2, 3, 520, 64},
                      Shape{1, 2, 1024, 64}, Shape{1, 2, 100, 32}, Shape{1, 2, 130, 128},
                      Shape{1, 1, 65, 128}, Shape{3, 1, 200, 32}, Shape{2, 2, 77, 16}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return absl::StrCat("B", s.b, "NH", s.nh, "T", s.t, "HS", s.hs);
    });

// Rejected before any GPU work, so this runs without a device too.
TEST(FlashAttentionArgs, RejectsBadArguments) {
  alignas(16) static uint16_t dummy[64];
  bf16* p = reinterpret_cast<bf16*>(dummy);
  float* f = reinterpret_cast<float*>(dummy);
  bf16* p2 = p + 32;  // a second, distinct 16-byte aligned pointer
  EXPECT_EQ(FlashAttentionForward(p, f, p, 1, 1, 8, 48, nullptr).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(FlashAttentionSupported(48));
  EXPECT_EQ(FlashAttentionForward(p, f, nullptr, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FlashAttentionForward(p, f, p, 1, 1, 0, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FlashAttentionForward(p + 1, f, p, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // y not 16-byte aligned
  EXPECT_EQ(FlashAttentionForward(p, f, p + 4, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // qkv not 16-byte aligned
  EXPECT_EQ(FlashAttentionBackward(p2, p, p, f, p, nullptr, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // no scratch
  EXPECT_EQ(FlashAttentionBackward(p, p, p, f, p, f, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // dqkv aliases qkv
  EXPECT_EQ(FlashAttentionBackward(p2, p, p, f, p, f, 1, 1, 8, 96, nullptr).code(),
            absl::StatusCode::kUnimplemented);
}

// Not a check: prints the per-layer times at the GPT-2 124M shape (B = 16, NH = 12, T = 1024,
// HS = 64) for the record.
TEST_F(FlashAttentionTest, TimingGpt2Shape) {
  const Shape s{16, 12, 1024, 64};
  std::mt19937 rng(7);
  const auto x = RandomBf16(s.elems(), 1.0f, rng);
  const auto x3 = RandomBf16(3 * s.elems(), 1.0f, rng);
  DeviceBuffer<uint16_t> d_qkv(x3), d_dqkv(x3), d_dy(x), d_y(x);
  DeviceBuffer<float> d_lse(std::vector<float>(s.heads() * s.t));
  DeviceBuffer<float> d_scratch(
      std::vector<float>(FlashAttentionBackwardScratchFloats(s.b, s.nh, s.t, s.hs)));
  const auto forward = [&] {
    return FlashAttentionForward(AsBf16(d_y), d_lse.get(), AsBf16(d_qkv), s.b, s.nh, s.t,
                                 s.hs, stream_);
  };
  const auto backward = [&] {
    return FlashAttentionBackward(AsBf16(d_dqkv), AsBf16(d_dy), AsBf16(d_y), d_lse.get(),
                                  AsBf16(d_qkv), d_scratch.get(), s.b, s.nh, s.t, s.hs, stream_);
  };
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  constexpr int kIters = 20;
  float ms[2];
  for (int which = 0; which < 2; ++which) {
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((which == 0 ? forward() : backward()).ok());
    CUDA_CHECK(cudaEventRecord(start, stream_));
    for (int i = 0; i < kIters; ++i) ASSERT_TRUE((which == 0 ? forward() : backward()).ok());
    CUDA_CHECK(cudaEventRecord(stop, stream_));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&ms[which], start, stop));
    ms[which] /= kIters;
  }
  // Causal FLOPs: 2 GEMMs forward, 7 backward (S and dP are computed twice), each 2 * HS
  // multiply-adds over the T (T + 1) / 2 visible pairs of every head.
  const double gemm = 2.0 * s.hs * s.heads() * s.t * (s.t + 1) / 2.0;
  std::printf("flash attention B=%d NH=%d T=%d HS=%d: forward %.3f ms (%.0f TFLOP/s), "
              "backward %.3f ms (%.0f TFLOP/s)\n",
              s.b, s.nh, s.t, s.hs, ms[0], 2 * gemm / ms[0] * 1e-9, ms[1],
              7 * gemm / ms[1] * 1e-9);
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
}

}  // namespace
}  // namespace weft::engine::cuda
