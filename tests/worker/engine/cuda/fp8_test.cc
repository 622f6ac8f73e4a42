// The FP8 casts (fp8.h) and GEMMs (Blas::Fp8Linear, Fp8LinearF32) against host references:
//  - Fp8Amax is the exact maximum of |x|, NaN if x holds one, and 0 for zeros; Fp8Cast's own
//    (delayed scaling: the cast from another amax, saturating beyond it) is the same.
//  - Fp8Cast is bit for bit the host's cast: x * s rounded to the nearest FP8 value (ties to
//    the even code), saturating at the largest finite one, with s = max_finite / amax computed
//    on the host; scale_inv is exactly 1 / s; the transpose is the cast's transpose, byte for
//    byte; zeros give s = 1 and all-zero codes; bad shapes are refused naming the argument.
//  - The GEMMs match a double-precision product of the decoded FP8 operands times the host's
//    scale_inv (bf16 output: to bf16 rounding and the tensor cores' FP8 accumulation; fp32
//    output: to that accumulation), with a bias and a residual, accumulating, for E4M3 x E4M3 and
//    either operand E5M2; and the whole path (amax, cast, GEMM) stays within FP8's quantization
//    error of the bf16 GEMM of the same inputs.
//  - Fp8Linears, the FP8 Linear layers built on them, follows Blas's bf16 ones (its test).
// Label gpu: skips without a GPU; the GEMMs skip below compute capability 8.9.
#include "worker/engine/cuda/fp8.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/cuda/cuda_test_util.h"
#include "worker/engine/cuda/fp8_linear.h"
#include "worker/engine/cuda/matmul.h"

namespace weft::engine::cuda {
namespace {

using test_util::CudaStreamTest;
using test_util::DeviceBuffer;
using test_util::FromBf16Bits;
using test_util::RandomBf16Bits;
using test_util::ToBf16Bits;

// The value an FP8 code stands for (NaN for NaN codes, infinities for E5M2's).
double Decode(uint8_t code, Fp8Format format) {
  const bool e4m3 = format == Fp8Format::kE4M3;
  const int mant_bits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const int exp_max = e4m3 ? 15 : 31;
  const double sign = (code & 0x80) != 0 ? -1.0 : 1.0;
  const int exp = (code & 0x7f) >> mant_bits;
  const int mant = code & ((1 << mant_bits) - 1);
  if (e4m3 && exp == exp_max && mant == (1 << mant_bits) - 1) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (!e4m3 && exp == exp_max) {
    return mant == 0 ? sign * std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::quiet_NaN();
  }
  const double frac = static_cast<double>(mant) / (1 << mant_bits);
  if (exp == 0) return sign * std::ldexp(frac, 1 - bias);
  return sign * std::ldexp(1.0 + frac, exp - bias);
}

// The host's cast of y (already x * s in float): the nearest finite code, ties to the even
// code (the mantissa's last bit is the code's), beyond the largest finite value that value.
uint8_t Encode(float y, Fp8Format format) {
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    const double v = Decode(static_cast<uint8_t>(c), format);
    if (!std::isfinite(v)) continue;
    if ((v == 0.0 && std::signbit(v) != std::signbit(y))) continue;  // zero keeps y's sign
    const double err = std::fabs(v - static_cast<double>(y));
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return best;
}

float HostScale(float amax, Fp8Format format) {
  return amax > 0.0f ? Fp8MaxFinite(format) / amax : 1.0f;
}

float HostAmax(const std::vector<uint16_t>& x) {
  float m = 0.0f;
  for (uint16_t b : x) m = std::max(m, std::fabs(FromBf16Bits(b)));
  return m;
}

class Fp8Test : public CudaStreamTest {
 protected:
  Fp8Test() : CudaStreamTest("the FP8 casts and GEMMs") {}

  // Whether this GPU runs FP8 GEMMs (compute capability 8.9 or later).
  static bool Fp8Gemms() {
    int device = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major * 10 + minor >= 89;
  }

  float DeviceAmax(const std::vector<uint16_t>& x) {
    DeviceBuffer<uint16_t> d_x(x);
    DeviceBuffer<float> d_amax(std::vector<float>{-1.0f});
    EXPECT_TRUE(Fp8Amax(d_amax.get(), d_x.bf16(), static_cast<int64_t>(x.size()), stream_).ok());
    return d_amax.ToHostOn(stream_)[0];
  }

  struct Cast {
    std::vector<uint8_t> out, out_t;
    float scale_inv = 0;
  };
  // x (rows, cols) cast on the device, straight and transposed in one call.
  Cast DeviceCast(const std::vector<uint16_t>& x, int rows, int cols, Fp8Format format) {
    DeviceBuffer<uint16_t> d_x(x);
    DeviceBuffer<float> d_amax(std::vector<float>{0.0f});
    DeviceBuffer<float> d_scale_inv(std::vector<float>{-1.0f});
    DeviceBuffer<uint8_t> d_out(std::vector<uint8_t>(x.size(), 0xAA));
    DeviceBuffer<uint8_t> d_out_t(std::vector<uint8_t>(x.size(), 0xAA));
    EXPECT_TRUE(Fp8Amax(d_amax.get(), d_x.bf16(), static_cast<int64_t>(x.size()), stream_).ok());
    const absl::Status s = Fp8Cast(d_out.get(), d_out_t.get(), d_scale_inv.get(), d_x.bf16(),
                                   d_amax.get(), rows, cols, format, stream_);
    EXPECT_TRUE(s.ok()) << s;
    return {d_out.ToHostOn(stream_), d_out_t.ToHostOn(stream_), d_scale_inv.ToHostOn(stream_)[0]};
  }
};

TEST_F(Fp8Test, AmaxIsTheExactMaximumOfMagnitudes) {
  std::mt19937 rng(3);
  std::vector<uint16_t> x = RandomBf16Bits(4096 * 3 + 8, 1.0f, rng);
  x[777] = ToBf16Bits(-123.5f);  // the largest magnitude, negative
  EXPECT_EQ(DeviceAmax(x), 123.5f);
  EXPECT_EQ(DeviceAmax(x), HostAmax(x));
  EXPECT_EQ(DeviceAmax(std::vector<uint16_t>(64, ToBf16Bits(0.0f))), 0.0f);
  x[5000] = 0x7fc0;  // a bf16 NaN
  EXPECT_TRUE(std::isnan(DeviceAmax(x)));
}

TEST_F(Fp8Test, CastIsTheHostsCastAndItsTranspose) {
  for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    SCOPED_TRACE(Fp8FormatName(format));
    // Not multiples of the 64-element tiles; values over many binades, down to FP8's
    // subnormals, and exact zeros of both signs.
    const int rows = 80, cols = 208;
    std::mt19937 rng(11);
    std::vector<uint16_t> x = RandomBf16Bits(static_cast<size_t>(rows) * cols, 1.0f, rng);
    std::uniform_real_distribution<float> binade(-14.0f, 4.0f);
    for (size_t i = 0; i < x.size(); i += 3) {
      x[i] = ToBf16Bits(FromBf16Bits(x[i]) * std::exp2(binade(rng)));
    }
    x[1] = ToBf16Bits(0.0f);
    x[2] = ToBf16Bits(-0.0f);
    const Cast cast = DeviceCast(x, rows, cols, format);
    const float s = HostScale(HostAmax(x), format);
    EXPECT_EQ(cast.scale_inv, 1.0f / s);
    int mismatches = 0, at_max = 0;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r) * cols + c;
        const uint8_t want = Encode(FromBf16Bits(x[i]) * s, format);
        if (cast.out[i] != want && ++mismatches <= 5) {
          ADD_FAILURE() << "(" << r << ", " << c << ") x " << FromBf16Bits(x[i]) << ": code "
                        << int{cast.out[i]} << " want " << int{want};
        }
        EXPECT_EQ(cast.out_t[static_cast<size_t>(c) * rows + r], cast.out[i]);
        at_max += std::fabs(Decode(cast.out[i], format)) == Fp8MaxFinite(format);
      }
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_GE(at_max, 1);  // amax lands on the largest finite value
  }
}

// Delayed scaling: the cast takes an amax from elsewhere (here half x's own, as a history from
// smaller steps would give) and reduces x's own in the same pass.
TEST_F(Fp8Test, CastWithAnotherAmaxSaturatesAndReducesItsOwn) {
  const int rows = 64, cols = 96;
  std::mt19937 rng(19);
  const std::vector<uint16_t> x = RandomBf16Bits(static_cast<size_t>(rows) * cols, 3.0f, rng);
  const float own = HostAmax(x);
  DeviceBuffer<uint16_t> d_x(x);
  DeviceBuffer<float> d_stale(std::vector<float>{own / 2});
  DeviceBuffer<float> d_scale_inv(std::vector<float>{-1.0f});
  DeviceBuffer<float> d_amax_out(std::vector<float>{-1.0f});
  DeviceBuffer<uint8_t> d_out(std::vector<uint8_t>(x.size(), 0xAA));
  const absl::Status s = Fp8Cast(d_out.get(), nullptr, d_scale_inv.get(), d_x.bf16(), d_stale.get(),
                                 rows, cols, Fp8Format::kE4M3, stream_, d_amax_out.get());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(d_amax_out.ToHostOn(stream_)[0], own);
  const float scale = HostScale(own / 2, Fp8Format::kE4M3);
  EXPECT_EQ(d_scale_inv.ToHostOn(stream_)[0], 1.0f / scale);
  const std::vector<uint8_t> out = d_out.ToHostOn(stream_);
  int saturated = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(out[i], Encode(FromBf16Bits(x[i]) * scale, Fp8Format::kE4M3)) << "element " << i;
    saturated += std::fabs(Decode(out[i], Fp8Format::kE4M3)) == 448.0;
  }
  EXPECT_GT(saturated, 1);  // what lay beyond the stale amax
  EXPECT_EQ(Fp8Cast(d_out.get(), nullptr, d_scale_inv.get(), d_x.bf16(), d_stale.get(), rows, cols,
                    Fp8Format::kE4M3, stream_, d_stale.get())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The tallies (Fp8CastCounts) are the host's count of what the cast did, for both formats: over
// values spread across 42 binades (E5M2 spans 32) some underflow to zero, and under a stale amax
// of half the own some saturate. Zeros underflow nothing, and a second cast adds to the counts.
TEST_F(Fp8Test, CastCountsUnderflowsAndSaturations) {
  const int rows = 80, cols = 48;
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> binade(-40.0f, 2.0f);
  std::vector<uint16_t> x(static_cast<size_t>(rows) * cols);
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = i % 17 == 0 ? 0.0f : std::exp2(binade(rng)) * (i % 2 == 0 ? 1.0f : -1.0f);
    x[i] = ToBf16Bits(v);
  }
  const float own = HostAmax(x);
  for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    SCOPED_TRACE(Fp8FormatName(format));
    const float scale = HostScale(own / 2, format);
    Fp8CastCounts want;
    for (uint16_t b : x) {
      const float v = FromBf16Bits(b);
      want.values += 1;
      want.underflows += v != 0.0f && (Encode(v * scale, format) & 0x7f) == 0;
      want.saturated += std::fabs(v * scale) >= Fp8SaturationThreshold(format);
    }
    ASSERT_GT(want.underflows, 10u);
    ASSERT_GT(want.saturated, 0u);
    DeviceBuffer<uint16_t> d_x(x);
    DeviceBuffer<float> d_stale(std::vector<float>{own / 2});
    DeviceBuffer<uint8_t> d_out_t(std::vector<uint8_t>(x.size()));
    DeviceBuffer<uint64_t> d_counts(std::vector<uint64_t>(3, 0));
    auto* counts = reinterpret_cast<Fp8CastCounts*>(d_counts.get());
    for (int pass = 1; pass <= 2; ++pass) {
      const absl::Status s = Fp8Cast(nullptr, d_out_t.get(), nullptr, d_x.bf16(), d_stale.get(),
                                     rows, cols, format, stream_, nullptr, counts);
      ASSERT_TRUE(s.ok()) << s;
      const std::vector<uint64_t> got = d_counts.ToHostOn(stream_);
      EXPECT_EQ(got[0], pass * want.values);
      EXPECT_EQ(got[1], pass * want.underflows);
      EXPECT_EQ(got[2], pass * want.saturated);
    }
    // Under its own amax (current scaling) nothing saturates, though the largest value may land
    // a rounding above the largest finite one.
    DeviceBuffer<float> d_own(std::vector<float>{own});
    DeviceBuffer<uint64_t> d_own_counts(std::vector<uint64_t>(3, 0));
    ASSERT_TRUE(Fp8Cast(nullptr, d_out_t.get(), nullptr, d_x.bf16(), d_own.get(), rows, cols,
                        format, stream_, nullptr,
                        reinterpret_cast<Fp8CastCounts*>(d_own_counts.get()))
                    .ok());
    EXPECT_EQ(d_own_counts.ToHostOn(stream_)[2], 0u);
  }
}

TEST_F(Fp8Test, ZerosCastToZeroWithUnitScale) {
  const Cast cast = DeviceCast(std::vector<uint16_t>(32 * 32, 0), 32, 32, Fp8Format::kE4M3);
  EXPECT_EQ(cast.scale_inv, 1.0f);
  EXPECT_EQ(cast.out, std::vector<uint8_t>(32 * 32, 0));
  EXPECT_EQ(cast.out_t, std::vector<uint8_t>(32 * 32, 0));
}

TEST_F(Fp8Test, BadShapesAreRefusedByName) {
  DeviceBuffer<uint16_t> x(std::vector<uint16_t>(48 * 48, 0));
  DeviceBuffer<float> amax(std::vector<float>{1.0f});
  DeviceBuffer<uint8_t> out(std::vector<uint8_t>(48 * 48, 0));
  absl::Status s =
      Fp8Cast(out.get(), nullptr, nullptr, x.bf16(), amax.get(), 40, 48, Fp8Format::kE4M3, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rows = 40"), std::string::npos) << s;
  s = Fp8Cast(out.get(), nullptr, nullptr, x.bf16(), amax.get(), 48, 24, Fp8Format::kE4M3, stream_);
  EXPECT_NE(s.message().find("cols = 24"), std::string::npos) << s;
  s = Fp8Cast(nullptr, nullptr, nullptr, x.bf16(), amax.get(), 48, 48, Fp8Format::kE4M3, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = Fp8Amax(amax.get(), x.bf16(), 12, stream_);
  EXPECT_NE(s.message().find("n = 12"), std::string::npos) << s;
}

// One FP8 GEMM case: a (N, K) in a_format, b (M, K) in b_format.
struct GemmCase {
  int n, k, m;
  Fp8Format a_format, b_format;
  bool bias, fast_accum;
};

class Fp8GemmTest : public Fp8Test, public ::testing::WithParamInterface<GemmCase> {};

TEST_P(Fp8GemmTest, MatchesTheDecodedProduct) {
  const GemmCase& g = GetParam();
  if (!Fp8Gemms()) GTEST_SKIP() << "FP8 GEMMs need compute capability 8.9";
  absl::StatusOr<std::unique_ptr<Blas>> blas = Blas::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  std::mt19937 rng(g.n * 7 + g.k + g.m);
  const std::vector<uint16_t> a = RandomBf16Bits(static_cast<size_t>(g.n) * g.k, 2.0f, rng);
  const std::vector<uint16_t> b = RandomBf16Bits(static_cast<size_t>(g.m) * g.k, 0.05f, rng);
  const std::vector<uint16_t> bias = RandomBf16Bits(g.m, 1.0f, rng);
  // With the bias, a residual too (the output projections' epilogue).
  const std::vector<uint16_t> residual = RandomBf16Bits(static_cast<size_t>(g.n) * g.m, 1.0f, rng);
  const Cast ca = DeviceCast(a, g.n, g.k, g.a_format);
  const Cast cb = DeviceCast(b, g.m, g.k, g.b_format);
  const double a_inv = 1.0 / HostScale(HostAmax(a), g.a_format);
  const double b_inv = 1.0 / HostScale(HostAmax(b), g.b_format);
  std::vector<double> ref(static_cast<size_t>(g.n) * g.m);
  std::vector<double> exact(ref.size());  // the bf16 inputs' product, unquantized
  double ref_ss = 0;
  for (int i = 0; i < g.n; ++i) {
    for (int j = 0; j < g.m; ++j) {
      double acc = 0, full = 0;
      for (int p = 0; p < g.k; ++p) {
        acc += Decode(ca.out[static_cast<size_t>(i) * g.k + p], g.a_format) *
               Decode(cb.out[static_cast<size_t>(j) * g.k + p], g.b_format);
        full += static_cast<double>(FromBf16Bits(a[static_cast<size_t>(i) * g.k + p])) *
                FromBf16Bits(b[static_cast<size_t>(j) * g.k + p]);
      }
      const double add =
          g.bias ? FromBf16Bits(bias[j]) + FromBf16Bits(residual[static_cast<size_t>(i) * g.m + j])
                 : 0.0;
      ref[static_cast<size_t>(i) * g.m + j] = acc * a_inv * b_inv + add;
      exact[static_cast<size_t>(i) * g.m + j] = full + add;
      ref_ss += acc * a_inv * b_inv * acc * a_inv * b_inv;
    }
  }
  const double rms = std::sqrt(ref_ss / ref.size());

  DeviceBuffer<uint8_t> d_a(ca.out), d_b(cb.out);
  DeviceBuffer<float> d_a_inv(std::vector<float>{ca.scale_inv});
  DeviceBuffer<float> d_b_inv(std::vector<float>{cb.scale_inv});
  DeviceBuffer<uint16_t> d_bias(bias);
  DeviceBuffer<uint16_t> d_residual(residual);
  const Fp8Operand op_a{d_a.get(), g.a_format, d_a_inv.get()};
  const Fp8Operand op_b{d_b.get(), g.b_format, d_b_inv.get()};

  // bf16 output, written over garbage.
  DeviceBuffer<uint16_t> d_out(std::vector<uint16_t>(ref.size(), test_util::kGarbageBits));
  absl::Status s = (*blas)->Fp8Linear(d_out.bf16(), op_a, op_b, g.bias ? d_bias.bf16() : nullptr,
                                      g.bias ? d_residual.bf16() : nullptr, g.n, g.k, g.m,
                                      g.fast_accum, stream_);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<uint16_t> out = d_out.ToHostOn(stream_);
  double worst = 0, err_ss = 0, exact_ss = 0, max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double got = FromBf16Bits(out[i]);
    max_err = std::max(max_err, std::fabs(got - ref[i]) / rms);
    // bf16's rounding (2^-9 relative) and the tensor cores' FP8 accumulation, which keeps
    // fewer bits than fp32 in its partial sums (below), more so with fast accumulation.
    const double tol = std::ldexp(std::fabs(ref[i]), -8) + (g.fast_accum ? 4e-3 : 1e-3) * rms;
    worst = std::max(worst, std::fabs(got - ref[i]) / tol);
    err_ss += (got - exact[i]) * (got - exact[i]);
    exact_ss += exact[i] * exact[i];
  }
  EXPECT_LE(worst, 1.0);
  // Against the unquantized product: E4M3 rounds to 2^-4 relative, E5M2 to 2^-3.
  const double quantized = std::sqrt(err_ss / exact_ss);
  std::printf(
      "FP8 %s x %s n=%d k=%d m=%d%s%s: worst %.3f of tolerance (max error %.2e of the rms), "
      "%.4f rms from bf16\n",
      Fp8FormatName(g.a_format), Fp8FormatName(g.b_format), g.n, g.k, g.m, g.bias ? " bias" : "",
      g.fast_accum ? " fast" : "", worst, max_err, quantized);
  EXPECT_LE(quantized,
            g.a_format == Fp8Format::kE5M2 || g.b_format == Fp8Format::kE5M2 ? 0.12 : 0.06);

  if (g.bias || g.fast_accum) return;
  // fp32 output: written, then accumulated onto itself.
  DeviceBuffer<float> d_f32(std::vector<float>(ref.size(), 7.0f));
  s = (*blas)->Fp8LinearF32(d_f32.get(), op_a, op_b, g.n, g.k, g.m, false, stream_);
  ASSERT_TRUE(s.ok()) << s;
  s = (*blas)->Fp8LinearF32(d_f32.get(), op_a, op_b, g.n, g.k, g.m, true, stream_);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<float> f32 = d_f32.ToHostOn(stream_);
  double f32_err = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    f32_err = std::max(f32_err, std::fabs(f32[i] - 2 * ref[i]));
  std::printf("  fp32 output: max error %.2e of the rms\n", f32_err / (2 * rms));
  for (size_t i = 0; i < ref.size(); ++i) {
    // The FP8 tensor cores' partial sums keep fewer bits than fp32: on an H200 at K = 256 the
    // largest elements came out 5e-4 relative from the double product (1.2e-3 of the rms).
    ASSERT_NEAR(f32[i], 2 * ref[i], 2e-3 * std::fabs(ref[i]) + 2e-3 * rms) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8GemmTest,
    ::testing::Values(GemmCase{64, 256, 48, Fp8Format::kE4M3, Fp8Format::kE4M3, false, false},
                      GemmCase{64, 256, 48, Fp8Format::kE4M3, Fp8Format::kE4M3, true, false},
                      GemmCase{64, 256, 48, Fp8Format::kE4M3, Fp8Format::kE4M3, false, true},
                      // the input gradient: the output gradient E5M2, the weight E4M3
                      GemmCase{32, 112, 80, Fp8Format::kE5M2, Fp8Format::kE4M3, false, false},
                      // the weight gradient: the output gradient^T E5M2, the input^T E4M3
                      GemmCase{80, 96, 16, Fp8Format::kE4M3, Fp8Format::kE5M2, false, false}),
    [](const ::testing::TestParamInfo<GemmCase>& info) {
      const GemmCase& g = info.param;
      return std::string(Fp8FormatName(g.a_format)) + "x" + Fp8FormatName(g.b_format) + "_" +
             std::to_string(g.n) + "_" + std::to_string(g.k) + "_" + std::to_string(g.m) +
             (g.bias ? "_bias" : "") + (g.fast_accum ? "_fast" : "");
    });

TEST_F(Fp8Test, GemmRefusesWhatCuBlasLtCannotRun) {
  absl::StatusOr<std::unique_ptr<Blas>> blas = Blas::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  DeviceBuffer<uint8_t> a(std::vector<uint8_t>(64 * 64, 0));
  DeviceBuffer<float> inv(std::vector<float>{1.0f});
  DeviceBuffer<uint16_t> out(std::vector<uint16_t>(64 * 64, 0));
  const Fp8Operand e4{a.get(), Fp8Format::kE4M3, inv.get()};
  const Fp8Operand e5{a.get(), Fp8Format::kE5M2, inv.get()};
  absl::Status s =
      (*blas)->Fp8Linear(out.bf16(), e5, e5, nullptr, nullptr, 64, 64, 64, false, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("both E5M2"), std::string::npos) << s;
  s = (*blas)->Fp8Linear(out.bf16(), e4, e4, nullptr, nullptr, 64, 40, 64, false, stream_);
  EXPECT_NE(s.message().find("k = 40"), std::string::npos) << s;
  const Fp8Operand unscaled{a.get(), Fp8Format::kE4M3, nullptr};
  s = (*blas)->Fp8Linear(out.bf16(), e4, unscaled, nullptr, nullptr, 64, 64, 64, false, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  DeviceBuffer<float> invs(std::vector<float>(8, 1.0f));
  const Fp8Operand misaligned{a.get(), Fp8Format::kE4M3, invs.get() + 1};
  s = (*blas)->Fp8Linear(out.bf16(), e4, misaligned, nullptr, nullptr, 64, 64, 64, false, stream_);
  EXPECT_NE(s.message().find("b.scale_inv is not 16-byte aligned"), std::string::npos) << s;
}

// Fp8Linears (fp8_linear.h), the FP8 path a model's Linear layers take, against Blas's bf16
// ones on the same inputs: within FP8's quantization error, forward (bias and residual in the
// epilogue) and backward (the weight gradient accumulated, the input gradient written), the
// same bits when the input gradient is written over the input, and shapes beyond its scratch
// refused.
class Fp8LinearsTest : public Fp8Test {
 protected:
  // ||x - y|| / ||y - base||, base null for 0: the relative rms error of x against y's part
  // past base.
  template <typename T>
  static double RelError(const std::vector<T>& x, const std::vector<T>& y,
                         const std::vector<T>* base = nullptr) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double a = Value(x[i]), b = Value(y[i]), o = base == nullptr ? 0 : Value((*base)[i]);
      err += (a - b) * (a - b);
      ref += (b - o) * (b - o);
    }
    return std::sqrt(err / ref);
  }
  static double Value(uint16_t bits) { return FromBf16Bits(bits); }
  static double Value(float x) { return x; }
};

TEST_F(Fp8LinearsTest, FollowsTheBf16LinearsWithinFp8Error) {
  if (!Fp8Gemms()) GTEST_SKIP() << "FP8 GEMMs need compute capability 8.9";
  absl::StatusOr<std::unique_ptr<Blas>> blas = Blas::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  const int n = 96, c = 128, oc = 80;
  DeviceBuffer<char> scratch_mem(
      std::vector<char>(Fp8LinearScratch::Bytes(128, 160, size_t{160} * 128)));
  Fp8Linears fp8(blas->get(), Fp8LinearScratch::At(scratch_mem.get(), 128, 160, size_t{160} * 128));
  std::mt19937 rng(5);
  const std::vector<uint16_t> inp = RandomBf16Bits(static_cast<size_t>(n) * c, 1.0f, rng);
  const std::vector<uint16_t> weight = RandomBf16Bits(static_cast<size_t>(oc) * c, 0.05f, rng);
  const std::vector<uint16_t> bias = RandomBf16Bits(oc, 0.5f, rng);
  const std::vector<uint16_t> residual = RandomBf16Bits(static_cast<size_t>(n) * oc, 1.0f, rng);
  const std::vector<uint16_t> dout = RandomBf16Bits(static_cast<size_t>(n) * oc, 1e-3f, rng);
  DeviceBuffer<uint16_t> d_inp(inp), d_weight(weight), d_bias(bias), d_dout(dout);

  // Forward, the residual added in place (out is the residual's buffer), as the models do.
  DeviceBuffer<uint16_t> out8(residual), out16(residual);
  absl::Status s = fp8.Forward(out8.bf16(), d_inp.bf16(), d_weight.bf16(), d_bias.bf16(),
                               out8.bf16(), n, c, oc, stream_);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE((*blas)
                  ->LinearForwardResidual(out16.bf16(), d_inp.bf16(), d_weight.bf16(),
                                          d_bias.bf16(), out16.bf16(), n, c, oc, stream_)
                  .ok());
  std::vector<uint16_t> base = residual;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < oc; ++j) {
      base[static_cast<size_t>(i) * oc + j] = ToBf16Bits(
          FromBf16Bits(residual[static_cast<size_t>(i) * oc + j]) + FromBf16Bits(bias[j]));
    }
  }
  const double fwd = RelError(out8.ToHostOn(stream_), out16.ToHostOn(stream_), &base);

  // Backward: the weight gradient accumulated onto 1s, the input gradient written.
  DeviceBuffer<float> dw8(test_util::Filled(static_cast<size_t>(oc) * c, 1.0f));
  DeviceBuffer<float> dw16(test_util::Filled(static_cast<size_t>(oc) * c, 1.0f));
  DeviceBuffer<uint16_t> dinp8(std::vector<uint16_t>(inp.size(), test_util::kGarbageBits));
  DeviceBuffer<uint16_t> dinp16(std::vector<uint16_t>(inp.size(), test_util::kGarbageBits));
  s = fp8.Backward(dinp8.bf16(), dw8.get(), true, d_dout.bf16(), d_inp.bf16(), d_weight.bf16(), n,
                   c, oc, stream_);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(
      (*blas)
          ->LinearBackwardWeight(dw16.get(), d_dout.bf16(), d_inp.bf16(), n, c, oc, true, stream_)
          .ok());
  ASSERT_TRUE(
      (*blas)
          ->LinearBackwardInput(dinp16.bf16(), d_dout.bf16(), d_weight.bf16(), n, c, oc, stream_)
          .ok());
  const std::vector<float> ones(static_cast<size_t>(oc) * c, 1.0f);
  const double dw = RelError(dw8.ToHostOn(stream_), dw16.ToHostOn(stream_), &ones);
  const std::vector<uint16_t> dinp = dinp8.ToHostOn(stream_);
  const double dx = RelError(dinp, dinp16.ToHostOn(stream_));
  std::printf("Fp8Linears against bf16: forward %.4f, weight gradient %.4f, input gradient %.4f\n",
              fwd, dw, dx);
  EXPECT_LE(fwd, 0.06);  // E4M3 x E4M3
  EXPECT_LE(dw, 0.12);   // E5M2 x E4M3
  EXPECT_LE(dx, 0.12);
  EXPECT_GT(fwd, 0.0);  // it did run in FP8

  // The input gradient written over the input: the same bits.
  DeviceBuffer<uint16_t> in_place(inp);
  s = fp8.Backward(in_place.bf16(), dw8.get(), true, d_dout.bf16(), in_place.bf16(),
                   d_weight.bf16(), n, c, oc, stream_);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(in_place.ToHostOn(stream_), dinp);

  s = fp8.Forward(out8.bf16(), d_inp.bf16(), d_weight.bf16(), nullptr, nullptr, 144, c, oc,
                  stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("beyond the FP8 scratch"), std::string::npos) << s;
}

// What a Forward keeps (Fp8Linears::StartKeeping) serves the Backward of the same tensors: its
// bits are those of a Backward that casts afresh, and it reads the kept casts, not the tensors
// (they are overwritten here, which a caller must not do, to see it). Beyond the kept room only
// what fits is kept, and StartKeeping forgets.
TEST_F(Fp8LinearsTest, KeptCastsServeTheBackward) {
  if (!Fp8Gemms()) GTEST_SKIP() << "FP8 GEMMs need compute capability 8.9";
  absl::StatusOr<std::unique_ptr<Blas>> blas = Blas::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  const int n = 96, c = 128, oc = 80;
  const size_t both = Fp8LinearScratch::KeptBytes(static_cast<size_t>(n) * c) +
                      Fp8LinearScratch::KeptBytes(static_cast<size_t>(oc) * c);
  std::mt19937 rng(9);
  const std::vector<uint16_t> inp = RandomBf16Bits(static_cast<size_t>(n) * c, 1.0f, rng);
  const std::vector<uint16_t> weight = RandomBf16Bits(static_cast<size_t>(oc) * c, 0.05f, rng);
  const std::vector<uint16_t> dout = RandomBf16Bits(static_cast<size_t>(n) * oc, 1e-3f, rng);
  const std::vector<uint16_t> other = RandomBf16Bits(inp.size(), 3.0f, rng);
  const std::vector<uint16_t> other_w = RandomBf16Bits(weight.size(), 0.5f, rng);
  DeviceBuffer<uint16_t> d_dout(dout), out(std::vector<uint16_t>(static_cast<size_t>(n) * oc));

  // (dweight, dinp) of a Backward over (inp, weight) after a Forward kept what `kept_bytes`
  // holds, the tensors then overwritten with `other` and `other_w`.
  const auto run = [&](size_t kept_bytes, bool keep, int64_t* reads) {
    DeviceBuffer<char> mem(
        std::vector<char>(Fp8LinearScratch::Bytes(n, c, size_t{oc} * c, kept_bytes)));
    Fp8Linears fp8(blas->get(), Fp8LinearScratch::At(mem.get(), n, c, size_t{oc} * c, kept_bytes));
    DeviceBuffer<uint16_t> d_inp(inp), d_weight(weight);
    DeviceBuffer<float> dw(std::vector<float>(weight.size()));
    DeviceBuffer<uint16_t> dinp(std::vector<uint16_t>(inp.size()));
    if (keep) fp8.StartKeeping();
    EXPECT_TRUE(
        fp8.Forward(out.bf16(), d_inp.bf16(), d_weight.bf16(), nullptr, nullptr, n, c, oc, stream_)
            .ok());
    fp8.StopKeeping();
    if (keep) {
      d_inp.CopyFromHostOn(other, stream_);
      d_weight.CopyFromHostOn(other_w, stream_);
    }
    EXPECT_TRUE(fp8.Backward(dinp.bf16(), dw.get(), false, d_dout.bf16(), d_inp.bf16(),
                             d_weight.bf16(), n, c, oc, stream_)
                    .ok());
    *reads = fp8.kept_reads();
    return std::make_pair(dw.ToHostOn(stream_), dinp.ToHostOn(stream_));
  };
  int64_t reads = -1;
  const auto fresh = run(0, false, &reads);
  EXPECT_EQ(reads, 0);
  const auto kept = run(both, true, &reads);
  EXPECT_EQ(reads, 2);
  EXPECT_EQ(kept.first, fresh.first);
  EXPECT_EQ(kept.second, fresh.second);
  // Room for the input only: the weight is cast from what the buffer now holds.
  const auto input_only =
      run(Fp8LinearScratch::KeptBytes(static_cast<size_t>(n) * c), true, &reads);
  EXPECT_EQ(reads, 1);
  EXPECT_NE(input_only.second, fresh.second);
}

}  // namespace
}  // namespace weft::engine::cuda
