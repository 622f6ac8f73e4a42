// FlashAttentionForward / FlashAttentionBackward (worker/engine/cuda/flash_attention.cu)
// against a host reference of causal attention, in double, on the same bf16-rounded inputs.
// The kernels work on the model's layouts: q, k, v read from qkv (B, T, W), W = (NH + 2 NKV) HS
// (rows [q (NH heads) | k (NKV heads) | v (NKV heads)], GPT-2's (B, T, 3C) when NKV = NH), y and
// dy (B, T, C), dq, dk, dv written into dqkv (B, T, W); the reference works per head on its
// own (B, heads, T, HS) copies, query head h reading kv head h / (NH / NKV) (grouped-query
// attention: a kv head's dk, dv sum over its query heads), and every element of y and dqkv
// (prefilled with garbage) is compared, so a missed or misplaced write shows.
//
// Error metric per tensor: max_i |gpu_i - ref_i| / max_i |ref_i|. What the kernels round:
// P to bf16 before P @ V (and P, dS before the backward's products), the outputs to bf16, and
// D = rowsum(dy * y) is taken from the bf16 y. Tolerances:
//  - y, dq, dk, dv: 1e-2 (bf16 P, dS and output rounding, 2^-9 each; seen on an H100: at most
//    2.5e-3 for y and dv, 4.4e-3 for dq and dk, where dS = P * (dP - D) follows a cancellation);
//  - lse: 1e-5 relative to the largest |lse| (fp32 online softmax vs double; seen 1.3e-7).
// Shapes cover ragged last tiles (T = 1, 77, 100, 520, 65 with the 32-wide HS = 128 walk),
// T = 1024 with B * NH = 2, every supported head size (16, 32, 64, 128), and grouped-query
// attention with NKV = NH / 4 and NH / 2 (and NKV = 1) at HS 64 and 128 with T not a multiple
// of 64; the backward is checked bit-deterministic.
// At HS 64 and 128 both forward kernels (mma.sync, and the Hopper wgmma one where it runs) are
// checked against the reference, each other and their own second run.
// Document masking (doc_starts, packed sequences), for both kernels at every head size with
// grouped-query heads: forward and backward against each document run alone through the plain
// causal kernel (to bf16 accuracy) and against the reference with the documents' masks;
// doc_starts all zero bit for bit the nullptr (plain causal) result.
// Sliding window (Mistral's): forward and backward of both kernels against the reference with
// the window, alone and with documents, at T not a multiple of any tile, windows smaller than
// a tile, T - 1, T and beyond (bit for bit plain causal), grouped-query heads, every head size,
// and T = 16500; the softmax fallback's ops with a window; a negative window refused.
// A timing test prints the GPT-2 124M shape (B = 16, NH = 12, T = 1024, HS = 64).
// Skips (GTEST_SKIP) when no CUDA device is present, except the argument checks, which fail
// before touching the GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
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

bf16* AsBf16(DeviceBuffer<uint16_t>& buf) { return buf.bf16(); }

struct Shape {
  int b, nh, t, hs;
  int nkv = 0;  // 0: NH (no grouping)
  int kv() const { return nkv > 0 ? nkv : nh; }
  int c() const { return nh * hs; }
  int width() const { return (nh + 2 * kv()) * hs; }  // W, the qkv row
  size_t heads() const { return static_cast<size_t>(b) * nh; }
  size_t elems() const { return heads() * t * hs; }  // of one (B, T, C) tensor
  size_t kv_elems() const { return static_cast<size_t>(b) * kv() * t * hs; }
  size_t qkv_elems() const { return static_cast<size_t>(b) * t * width(); }
};

// Which block of a row: q (NH heads at 0), k (NKV heads at NH * HS), v (NKV heads after k), or
// y, a (B, T, C) row of NH heads.
enum Part { kQ, kK, kV, kY };

// The heads of `part` of rows (B, T, row length) as (B, heads, T, HS):
// out[((b * heads + h) * T + t) * HS + d] = rows[(b * T + t) * row_len + start + h * HS + d].
template <typename T>
std::vector<T> ToHeads(const std::vector<T>& rows, const Shape& s, Part part) {
  const bool kv = part == kK || part == kV;
  const int heads = kv ? s.kv() : s.nh;
  const size_t row_len = part == kY ? s.c() : s.width();
  const size_t start = part == kK ? s.c() : part == kV ? s.c() + s.kv() * s.hs : 0;
  EXPECT_EQ(rows.size(), static_cast<size_t>(s.b) * s.t * row_len);
  std::vector<T> out(static_cast<size_t>(s.b) * heads * s.t * s.hs);
  for (int b = 0; b < s.b; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int t = 0; t < s.t; ++t) {
        const size_t src = (static_cast<size_t>(b) * s.t + t) * row_len + start +
                           static_cast<size_t>(h) * s.hs;
        const size_t dst = ((static_cast<size_t>(b) * heads + h) * s.t + t) * s.hs;
        for (int d = 0; d < s.hs; ++d) out[dst + d] = rows[src + d];
      }
    }
  }
  return out;
}

std::vector<uint16_t> RandomBf16(size_t n, float sigma, std::mt19937& rng) {
  return test_util::RandomBf16Bits(n, sigma, rng);
}

std::vector<double> ToDouble(const std::vector<uint16_t>& bits) {
  std::vector<double> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = FromBf16Bits(bits[i]);
  return out;
}

struct Reference {
  std::vector<double> y, lse, dq, dk, dv;
};

// Causal attention per query head, straight from the definition, in double; query head
// (b, h) reads kv head (b, h / G). q, dy: (B, NH, T, HS); k, v: (B, NKV, T, HS). With
// doc_starts (B, T), query i of sequence b sees keys [doc_starts[b, i], i] only; with a window
// w > 0, keys [i - w + 1, i] only (both: the intersection).
Reference ComputeReference(const Shape& s, const std::vector<double>& q,
                           const std::vector<double>& k, const std::vector<double>& v,
                           const std::vector<double>& dy,
                           const std::vector<int32_t>* doc_starts = nullptr, int window = 0) {
  const int t = s.t, hs = s.hs;
  const int group = s.nh / s.kv();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Reference ref;
  ref.y.assign(s.elems(), 0.0);
  ref.lse.assign(s.heads() * t, 0.0);
  ref.dq.assign(s.elems(), 0.0);
  ref.dk.assign(s.kv_elems(), 0.0);
  ref.dv.assign(s.kv_elems(), 0.0);
  std::vector<double> p(t), dp(t);
  for (size_t h = 0; h < s.heads(); ++h) {
    const size_t base = h * t * hs;
    const size_t kv_base = ((h / s.nh) * s.kv() + (h % s.nh) / group) * t * hs;
    // Row i of this query head's q or dy, and of its kv head's k or v.
    const auto row = [&](const std::vector<double>& m, int i) { return &m[base + i * hs]; };
    const auto kv_row = [&](const std::vector<double>& m, int i) { return &m[kv_base + i * hs]; };
    for (int i = 0; i < t; ++i) {
      int j0 = doc_starts == nullptr ? 0 : (*doc_starts)[(h / s.nh) * t + i];
      if (window > 0) j0 = std::max(j0, i - window + 1);
      double mx = -INFINITY;
      for (int j = j0; j <= i; ++j) {
        double dot = 0.0;
        for (int d = 0; d < hs; ++d) dot += row(q, i)[d] * kv_row(k, j)[d];
        p[j] = scale * dot;
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int j = j0; j <= i; ++j) sum += std::exp(p[j] - mx);
      const double lse = mx + std::log(sum);
      ref.lse[h * t + i] = lse;
      double dsum = 0.0;
      for (int j = j0; j <= i; ++j) {
        p[j] = std::exp(p[j] - lse);
        double dot = 0.0;
        for (int d = 0; d < hs; ++d) {
          ref.y[base + i * hs + d] += p[j] * kv_row(v, j)[d];
          dot += row(dy, i)[d] * kv_row(v, j)[d];
        }
        dp[j] = dot;
        dsum += p[j] * dot;
      }
      for (int j = j0; j <= i; ++j) {
        const double ds = scale * p[j] * (dp[j] - dsum);
        for (int d = 0; d < hs; ++d) {
          ref.dq[base + i * hs + d] += ds * kv_row(k, j)[d];
          ref.dk[kv_base + j * hs + d] += ds * row(q, i)[d];
          ref.dv[kv_base + j * hs + d] += p[j] * row(dy, i)[d];
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

// Random q, k, v (qkv) and dL/dy (dy), N(0, 1) in bf16 (scores of O(1) with a wide spread of
// softmax weights), and their double-precision reference.
struct RandomCase {
  std::vector<uint16_t> qkv, dy;
  Reference ref;
};
RandomCase MakeCase(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  RandomCase c;
  c.qkv = RandomBf16(s.qkv_elems(), 1.0f, rng);  // (B, T, W)
  c.dy = RandomBf16(s.elems(), 1.0f, rng);       // (B, T, C)
  c.ref = ComputeReference(s, ToDouble(ToHeads(c.qkv, s, kQ)), ToDouble(ToHeads(c.qkv, s, kK)),
                           ToDouble(ToHeads(c.qkv, s, kV)), ToDouble(ToHeads(c.dy, s, kY)));
  return c;
}

std::string ShapeName(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  return absl::StrCat("B", s.b, "NH", s.nh, "NKV", s.kv(), "T", s.t, "HS", s.hs);
}

class FlashAttentionTest : public test_util::CudaStreamTest {
 protected:
  FlashAttentionTest() : CudaStreamTest("flash attention") {}
};

class FlashAttentionShapeTest : public FlashAttentionTest,
                                public ::testing::WithParamInterface<Shape> {};

TEST_P(FlashAttentionShapeTest, MatchesHostReference) {
  const Shape s = GetParam();
  const RandomCase c = MakeCase(s, 1234 + s.t * 7 + s.hs);
  const auto& [qkv, dy, ref] = c;

  DeviceBuffer<uint16_t> d_qkv(qkv), d_dy(dy);
  DeviceBuffer<uint16_t> d_y(std::vector<uint16_t>(s.elems(), kGarbageBits));
  DeviceBuffer<uint16_t> d_dqkv(std::vector<uint16_t>(s.qkv_elems(), kGarbageBits));
  DeviceBuffer<float> d_lse(std::vector<float>(s.heads() * s.t, -1.0f));
  DeviceBuffer<float> d_scratch(
      std::vector<float>(FlashAttentionBackwardScratchFloats(s.b, s.nh, s.t, s.hs), 0.0f));

  ASSERT_TRUE(FlashAttentionSupported(s.hs));
  ASSERT_TRUE(FlashAttentionForward(AsBf16(d_y), d_lse.get(), AsBf16(d_qkv), nullptr, 0, s.b, s.nh,
                                    s.kv(), s.t, s.hs, stream_)
                  .ok());
  ASSERT_TRUE(FlashAttentionBackward(AsBf16(d_dqkv), AsBf16(d_dy), AsBf16(d_y), d_lse.get(),
                                     AsBf16(d_qkv), nullptr, 0, d_scratch.get(), s.b, s.nh, s.kv(),
                                     s.t, s.hs, stream_)
                  .ok());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  const auto dqkv1 = d_dqkv.ToHost();

  const double e_y = RelError(ToHeads(d_y.ToHost(), s, kY), ref.y);
  const double e_lse = RelError(d_lse.ToHost(), ref.lse);
  const double e_dq = RelError(ToHeads(dqkv1, s, kQ), ref.dq);
  const double e_dk = RelError(ToHeads(dqkv1, s, kK), ref.dk);
  const double e_dv = RelError(ToHeads(dqkv1, s, kV), ref.dv);
  std::printf("B=%d NH=%d NKV=%d T=%d HS=%d: y %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", s.b,
              s.nh, s.kv(), s.t, s.hs, e_y, e_lse, e_dq, e_dk, e_dv);
  EXPECT_LE(e_y, kTolY);
  EXPECT_LE(e_lse, kTolLse);
  EXPECT_LE(e_dq, kTolDqDk);
  EXPECT_LE(e_dk, kTolDqDk);
  EXPECT_LE(e_dv, kTolDv);

  // Deterministic: a second backward, into a freshly garbage-filled dqkv, gives the same bits.
  DeviceBuffer<uint16_t> d_dqkv2(std::vector<uint16_t>(s.qkv_elems(), kGarbageBits));
  ASSERT_TRUE(FlashAttentionBackward(AsBf16(d_dqkv2), AsBf16(d_dy), AsBf16(d_y), d_lse.get(),
                                     AsBf16(d_qkv), nullptr, 0, d_scratch.get(), s.b, s.nh, s.kv(),
                                     s.t, s.hs, stream_)
                  .ok());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(d_dqkv2.ToHost(), dqkv1);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionShapeTest,
    ::testing::Values(Shape{1, 1, 1, 64}, Shape{1, 2, 100, 64}, Shape{2, 3, 520, 64},
                      Shape{1, 2, 1024, 64}, Shape{1, 2, 100, 32}, Shape{1, 2, 130, 128},
                      Shape{1, 1, 65, 128}, Shape{3, 1, 200, 32}, Shape{2, 2, 77, 16},
                      // Grouped-query: NKV = NH / 4, NH / 2, 1, at HS 64 and 128, ragged T.
                      Shape{2, 8, 100, 64, 2}, Shape{1, 8, 150, 64, 4}, Shape{1, 4, 77, 64, 1},
                      Shape{1, 8, 130, 128, 2}, Shape{2, 4, 65, 128, 2},
                      Shape{1, 4, 200, 16, 2}),
    ShapeName);

// Both forward kernels at HS 64 and 128 (FlashAttentionForwardWith), each against the reference,
// and against each other: the Hopper (wgmma) one where it runs (sm_90 with sm_90a code), else
// only the mma.sync one, which runs everywhere. Shapes: one, two and three 128-key tiles with
// ragged ends, a single row, grouped-query heads.
class FlashForwardKernelsTest : public FlashAttentionTest,
                                public ::testing::WithParamInterface<Shape> {};

TEST_P(FlashForwardKernelsTest, BothMatchTheReferenceAndEachOther) {
  const Shape s = GetParam();
  const RandomCase c = MakeCase(s, 99 + s.t);
  const auto& [qkv, dy, ref] = c;
  DeviceBuffer<uint16_t> d_qkv(qkv);
  const auto run = [&](FlashAttentionKernel kernel, std::vector<uint16_t>* y,
                       std::vector<float>* lse) {
    DeviceBuffer<uint16_t> d_y(std::vector<uint16_t>(s.elems(), kGarbageBits));
    DeviceBuffer<float> d_lse(std::vector<float>(s.heads() * s.t, -1.0f));
    ASSERT_TRUE(FlashAttentionForwardWith(kernel, AsBf16(d_y), d_lse.get(), AsBf16(d_qkv), nullptr,
                                          0, s.b, s.nh, s.kv(), s.t, s.hs, stream_)
                    .ok());
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    *y = d_y.ToHost();
    *lse = d_lse.ToHost();
  };
  std::vector<uint16_t> y_sync, y_auto;
  std::vector<float> lse_sync, lse_auto;
  ASSERT_NO_FATAL_FAILURE(run(FlashAttentionKernel::kMmaSync, &y_sync, &lse_sync));
  EXPECT_LE(RelError(ToHeads(y_sync, s, kY), ref.y), kTolY);
  EXPECT_LE(RelError(lse_sync, ref.lse), kTolLse);
  ASSERT_NO_FATAL_FAILURE(run(FlashAttentionKernel::kAuto, &y_auto, &lse_auto));
  if (!FlashAttentionHopperForward(s.hs)) {
    EXPECT_EQ(y_auto, y_sync);  // kAuto is the mma.sync kernel here
    GTEST_SKIP() << "the Hopper forward does not run on this GPU (sm_90 with sm_90a code)";
  }
  std::vector<uint16_t> y_hopper, y_again;
  std::vector<float> lse_hopper, lse_again;
  ASSERT_NO_FATAL_FAILURE(run(FlashAttentionKernel::kHopper, &y_hopper, &lse_hopper));
  ASSERT_NO_FATAL_FAILURE(run(FlashAttentionKernel::kHopper, &y_again, &lse_again));
  const double e_y = RelError(ToHeads(y_hopper, s, kY), ref.y);
  const double e_lse = RelError(lse_hopper, ref.lse);
  std::printf("hopper B=%d NH=%d NKV=%d T=%d HS=%d: y %.2e lse %.2e (mma.sync y %.2e)\n", s.b,
              s.nh, s.kv(), s.t, s.hs, e_y, e_lse, RelError(ToHeads(y_sync, s, kY), ref.y));
  EXPECT_LE(e_y, kTolY);
  EXPECT_LE(e_lse, kTolLse);
  EXPECT_EQ(y_auto, y_hopper);  // kAuto takes the Hopper kernel where it runs
  EXPECT_EQ(y_again, y_hopper);  // deterministic
  EXPECT_EQ(lse_again, lse_hopper);
  // The kernels differ in the order of their fp32 sums only: at most a bf16 rounding apart.
  std::vector<double> sync_as_ref = ToDouble(y_sync);
  EXPECT_LE(RelError(y_hopper, sync_as_ref), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Hs64And128, FlashForwardKernelsTest,
    ::testing::Values(Shape{1, 1, 1, 128}, Shape{1, 1, 65, 128}, Shape{1, 2, 130, 128},
                      Shape{2, 2, 300, 128}, Shape{1, 8, 130, 128, 2},
                      Shape{2, 4, 257, 128, 1}, Shape{1, 2, 512, 128}, Shape{1, 1, 1, 64},
                      Shape{2, 3, 200, 64}, Shape{1, 8, 300, 64, 2}, Shape{1, 2, 512, 64, 1}),
    ShapeName);

// Both dK/dV kernels (FlashAttentionBackwardWith), each against the reference, and against
// each other where the Hopper one runs; dQ is the same kernel in both, so dq must match bit for
// bit. Shapes: one to three 128-key tiles with ragged ends, two rows, grouped-query heads (dK
// and dV summed over 2 and 4 query heads).
class FlashBackwardKernelsTest : public FlashAttentionTest,
                                 public ::testing::WithParamInterface<Shape> {};

TEST_P(FlashBackwardKernelsTest, BothMatchTheReferenceAndEachOther) {
  const Shape s = GetParam();
  const RandomCase c = MakeCase(s, 7 + s.t);
  const auto& [qkv, dy, ref] = c;
  DeviceBuffer<uint16_t> d_qkv(qkv), d_dy(dy);
  DeviceBuffer<uint16_t> d_y(std::vector<uint16_t>(s.elems(), kGarbageBits));
  DeviceBuffer<float> d_lse(std::vector<float>(s.heads() * s.t, -1.0f));
  DeviceBuffer<float> d_scratch(
      std::vector<float>(FlashAttentionBackwardScratchFloats(s.b, s.nh, s.t, s.hs), 0.0f));
  ASSERT_TRUE(FlashAttentionForward(AsBf16(d_y), d_lse.get(), AsBf16(d_qkv), nullptr, 0, s.b, s.nh,
                                    s.kv(), s.t, s.hs, stream_)
                  .ok());
  const auto run = [&](FlashAttentionKernel kernel, std::vector<uint16_t>* dqkv) {
    DeviceBuffer<uint16_t> d_dqkv(std::vector<uint16_t>(s.qkv_elems(), kGarbageBits));
    ASSERT_TRUE(FlashAttentionBackwardWith(kernel, AsBf16(d_dqkv), AsBf16(d_dy), AsBf16(d_y),
                                           d_lse.get(), AsBf16(d_qkv), nullptr, 0, d_scratch.get(),
                                           s.b, s.nh, s.kv(), s.t, s.hs, stream_)
                    .ok());
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    *dqkv = d_dqkv.ToHost();
  };
  const auto expect_near_reference = [&](const std::vector<uint16_t>& dqkv, const char* what) {
    const double e_dq = RelError(ToHeads(dqkv, s, kQ), ref.dq);
    const double e_dk = RelError(ToHeads(dqkv, s, kK), ref.dk);
    const double e_dv = RelError(ToHeads(dqkv, s, kV), ref.dv);
    std::printf("%s B=%d NH=%d NKV=%d T=%d HS=%d: dq %.2e dk %.2e dv %.2e\n", what, s.b, s.nh,
                s.kv(), s.t, s.hs, e_dq, e_dk, e_dv);
    EXPECT_LE(e_dq, kTolDqDk) << what;
    EXPECT_LE(e_dk, kTolDqDk) << what;
    EXPECT_LE(e_dv, kTolDv) << what;
  };
  std::vector<uint16_t> sync, automatic;
  ASSERT_NO_FATAL_FAILURE(run(FlashAttentionKernel::kMmaSync, &sync));
  expect_near_reference(sync, "mma.sync");
  ASSERT_NO_FATAL_FAILURE(run(FlashAttentionKernel::kAuto, &automatic));
  if (!FlashAttentionHopperForward(s.hs)) {
    EXPECT_EQ(automatic, sync);  // kAuto is the mma.sync kernel here
    GTEST_SKIP() << "the Hopper kernels do not run on this GPU (sm_90 with sm_90a code)";
  }
  std::vector<uint16_t> hopper, again;
  ASSERT_NO_FATAL_FAILURE(run(FlashAttentionKernel::kHopper, &hopper));
  ASSERT_NO_FATAL_FAILURE(run(FlashAttentionKernel::kHopper, &again));
  expect_near_reference(hopper, "hopper");
  EXPECT_EQ(automatic, hopper);  // kAuto takes the Hopper kernel where it runs
  EXPECT_EQ(again, hopper);      // deterministic
  EXPECT_EQ(ToHeads(hopper, s, kQ), ToHeads(sync, s, kQ));  // the same dQ kernel
  // dK and dV differ in the order of their fp32 sums only.
  EXPECT_LE(RelError(ToHeads(hopper, s, kK), ToDouble(ToHeads(sync, s, kK))), 2e-2);
  EXPECT_LE(RelError(ToHeads(hopper, s, kV), ToDouble(ToHeads(sync, s, kV))), 2e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Hs64And128, FlashBackwardKernelsTest,
    // Not T = 1: its exact dq and dk are 0 (dP = D), which a relative error cannot weigh.
    ::testing::Values(Shape{1, 1, 2, 128}, Shape{1, 1, 65, 128}, Shape{1, 2, 130, 128},
                      Shape{2, 2, 300, 128}, Shape{1, 8, 130, 128, 2},
                      Shape{2, 4, 257, 128, 1}, Shape{1, 2, 512, 128}, Shape{1, 1, 2, 64},
                      Shape{2, 3, 200, 64}, Shape{1, 8, 300, 64, 2}, Shape{1, 2, 512, 64, 1}),
    ShapeName);

// ---- Document masking (doc_starts, packed sequences) ----

// Documents packed into sequences: docs[b] lists sequence b's document lengths, which sum to
// T (the same T for every sequence).
struct DocCase {
  int nh, nkv, hs;
  std::vector<std::vector<int>> docs;
  bool reference = true;  // also against the double host reference (off where T is long)
  int t() const { return std::accumulate(docs[0].begin(), docs[0].end(), 0); }
  Shape shape() const { return Shape{static_cast<int>(docs.size()), nh, t(), hs, nkv}; }
};

// Document lengths cycling through `pattern` until they fill t, the last one cut at t.
std::vector<int> Cycle(const std::vector<int>& pattern, int t) {
  std::vector<int> lengths;
  for (int filled = 0, i = 0; filled < t; ++i) {
    lengths.push_back(std::min(pattern[i % pattern.size()], t - filled));
    filled += lengths.back();
  }
  return lengths;
}

// doc_starts (B, T): the first position of each position's document.
std::vector<int32_t> DocStartsOf(const std::vector<std::vector<int>>& docs, int t) {
  std::vector<int32_t> starts;
  for (const std::vector<int>& lengths : docs) {
    int start = 0;
    for (int len : lengths) {
      starts.insert(starts.end(), len, start);
      start += len;
    }
    EXPECT_EQ(start, t) << "a sequence's documents must fill T";
  }
  return starts;
}

std::vector<FlashAttentionKernel> KernelsAt(int hs) {
  std::vector<FlashAttentionKernel> kernels = {FlashAttentionKernel::kMmaSync};
  if (FlashAttentionHopperForward(hs)) kernels.push_back(FlashAttentionKernel::kHopper);
  return kernels;
}

const char* KernelName(FlashAttentionKernel kernel) {
  return kernel == FlashAttentionKernel::kHopper    ? "hopper"
         : kernel == FlashAttentionKernel::kMmaSync ? "mma.sync"
                                                    : "auto";
}

struct FlashOutputs {
  std::vector<uint16_t> y, dqkv;  // (B, T, C), (B, T, W)
  std::vector<float> lse;         // (B * NH * T)
};

// One forward and backward with `kernel` (the backward's dK/dV kernel chosen alike) into
// garbage-filled outputs, with doc_starts (host, copied to the device) or without (nullptr),
// and `window`.
FlashOutputs RunFlash(FlashAttentionKernel kernel, const Shape& s, const std::vector<uint16_t>& qkv,
                      const std::vector<uint16_t>& dy, const std::vector<int32_t>* doc_starts,
                      cudaStream_t stream, int window = 0) {
  DeviceBuffer<uint16_t> d_qkv(qkv), d_dy(dy);
  DeviceBuffer<uint16_t> d_y(std::vector<uint16_t>(s.elems(), kGarbageBits));
  DeviceBuffer<uint16_t> d_dqkv(std::vector<uint16_t>(s.qkv_elems(), kGarbageBits));
  DeviceBuffer<float> d_lse(std::vector<float>(s.heads() * s.t, -1.0f));
  DeviceBuffer<float> d_scratch(
      std::vector<float>(FlashAttentionBackwardScratchFloats(s.b, s.nh, s.t, s.hs), 0.0f));
  DeviceBuffer<int32_t> d_starts(doc_starts != nullptr ? *doc_starts : std::vector<int32_t>());
  const int32_t* starts = doc_starts != nullptr ? d_starts.get() : nullptr;
  const absl::Status forward =
      FlashAttentionForwardWith(kernel, AsBf16(d_y), d_lse.get(), AsBf16(d_qkv), starts, window,
                                s.b, s.nh, s.kv(), s.t, s.hs, stream);
  EXPECT_TRUE(forward.ok()) << forward;
  const absl::Status backward = FlashAttentionBackwardWith(
      kernel, AsBf16(d_dqkv), AsBf16(d_dy), AsBf16(d_y), d_lse.get(), AsBf16(d_qkv), starts, window,
      d_scratch.get(), s.b, s.nh, s.kv(), s.t, s.hs, stream);
  EXPECT_TRUE(backward.ok()) << backward;
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return {d_y.ToHost(), d_dqkv.ToHost(), d_lse.ToHost()};
}

// What document masking must equal: every document run on its own through the plain causal
// kernel (a sequence of its own length, B = 1), its y, lse and dqkv put back at its place.
FlashOutputs RunDocumentsAlone(FlashAttentionKernel kernel, const DocCase& c,
                               const std::vector<uint16_t>& qkv, const std::vector<uint16_t>& dy,
                               cudaStream_t stream) {
  const Shape s = c.shape();
  const size_t w = s.width(), cw = s.c();
  FlashOutputs out{std::vector<uint16_t>(s.elems()), std::vector<uint16_t>(s.qkv_elems()),
                   std::vector<float>(s.heads() * s.t)};
  for (int b = 0; b < s.b; ++b) {
    int start = 0;
    for (int len : c.docs[b]) {
      const Shape d{1, s.nh, len, s.hs, s.nkv};
      const size_t row0 = static_cast<size_t>(b) * s.t + start;  // the document's first row
      const std::vector<uint16_t> doc_qkv(qkv.begin() + row0 * w, qkv.begin() + (row0 + len) * w);
      const std::vector<uint16_t> doc_dy(dy.begin() + row0 * cw, dy.begin() + (row0 + len) * cw);
      const FlashOutputs alone = RunFlash(kernel, d, doc_qkv, doc_dy, nullptr, stream);
      std::copy(alone.y.begin(), alone.y.end(), out.y.begin() + row0 * cw);
      std::copy(alone.dqkv.begin(), alone.dqkv.end(), out.dqkv.begin() + row0 * w);
      for (int h = 0; h < s.nh; ++h) {
        std::copy(alone.lse.begin() + static_cast<size_t>(h) * len,
                  alone.lse.begin() + static_cast<size_t>(h + 1) * len,
                  out.lse.begin() + (static_cast<size_t>(b) * s.nh + h) * s.t + start);
      }
      start += len;
    }
  }
  return out;
}

std::vector<double> ToDouble(const std::vector<float>& x) {
  return std::vector<double>(x.begin(), x.end());
}

class FlashDocMaskTest : public FlashAttentionTest,
                         public ::testing::WithParamInterface<DocCase> {};

// Both kernels (mma.sync, and the Hopper ones where they run) with doc_starts against each
// document run alone through the same kernel without: the same attention, up to the order of
// the fp32 sums (the packed walk meets a document's keys in other tiles), so to bf16
// accuracy: y 1e-2, dq, dk, dv 2e-2 (as the two kernels against each other), lse 1e-5. Also
// against the double reference with document masking at the reference tolerances, and
// bit-deterministic.
TEST_P(FlashDocMaskTest, EqualsEachDocumentAlone) {
  const DocCase& c = GetParam();
  const Shape s = c.shape();
  std::mt19937 rng(31 + s.t * 3 + s.hs);
  const std::vector<uint16_t> qkv = RandomBf16(s.qkv_elems(), 1.0f, rng);  // (B, T, W)
  const std::vector<uint16_t> dy = RandomBf16(s.elems(), 1.0f, rng);       // (B, T, C)
  const std::vector<int32_t> starts = DocStartsOf(c.docs, s.t);
  Reference ref;
  if (c.reference) {
    ref = ComputeReference(s, ToDouble(ToHeads(qkv, s, kQ)), ToDouble(ToHeads(qkv, s, kK)),
                           ToDouble(ToHeads(qkv, s, kV)), ToDouble(ToHeads(dy, s, kY)), &starts);
  }
  for (const FlashAttentionKernel kernel : KernelsAt(s.hs)) {
    const char* name = KernelName(kernel);
    SCOPED_TRACE(name);
    const FlashOutputs packed = RunFlash(kernel, s, qkv, dy, &starts, stream_);
    const FlashOutputs alone = RunDocumentsAlone(kernel, c, qkv, dy, stream_);
    const double e_y = RelError(packed.y, ToDouble(alone.y));
    const double e_lse = RelError(packed.lse, ToDouble(alone.lse));
    const double e_dq = RelError(ToHeads(packed.dqkv, s, kQ), ToDouble(ToHeads(alone.dqkv, s, kQ)));
    const double e_dk = RelError(ToHeads(packed.dqkv, s, kK), ToDouble(ToHeads(alone.dqkv, s, kK)));
    const double e_dv = RelError(ToHeads(packed.dqkv, s, kV), ToDouble(ToHeads(alone.dqkv, s, kV)));
    std::printf("%s docs B=%d NH=%d NKV=%d T=%d HS=%d vs alone: y %.2e lse %.2e dq %.2e dk %.2e "
                "dv %.2e\n",
                name, s.b, s.nh, s.kv(), s.t, s.hs, e_y, e_lse, e_dq, e_dk, e_dv);
    EXPECT_LE(e_y, 1e-2);
    EXPECT_LE(e_lse, kTolLse);
    EXPECT_LE(e_dq, 2e-2);
    EXPECT_LE(e_dk, 2e-2);
    EXPECT_LE(e_dv, 2e-2);
    if (c.reference) {
      const double r_y = RelError(ToHeads(packed.y, s, kY), ref.y);
      const double r_lse = RelError(packed.lse, ref.lse);
      const double r_dq = RelError(ToHeads(packed.dqkv, s, kQ), ref.dq);
      const double r_dk = RelError(ToHeads(packed.dqkv, s, kK), ref.dk);
      const double r_dv = RelError(ToHeads(packed.dqkv, s, kV), ref.dv);
      std::printf("%s docs vs reference: y %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", name, r_y,
                  r_lse, r_dq, r_dk, r_dv);
      EXPECT_LE(r_y, kTolY);
      EXPECT_LE(r_lse, kTolLse);
      EXPECT_LE(r_dq, kTolDqDk);
      EXPECT_LE(r_dk, kTolDqDk);
      EXPECT_LE(r_dv, kTolDv);
    }
    const FlashOutputs again = RunFlash(kernel, s, qkv, dy, &starts, stream_);
    EXPECT_EQ(again.y, packed.y);  // deterministic
    EXPECT_EQ(again.lse, packed.lse);
    EXPECT_EQ(again.dqkv, packed.dqkv);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Docs, FlashDocMaskTest,
    ::testing::Values(
        // Grouped-query (NH 4, NKV 2) at every head size; documents of 1, 7, 64, 65, 200 ...
        // tokens, T not a multiple of any tile.
        DocCase{4, 2, 64, {{1, 7, 64, 65, 200, 3}, {200, 1, 139}}},
        DocCase{4, 2, 128, {{1, 7, 64, 65, 200, 3}, {200, 1, 139}}},
        DocCase{4, 2, 32, {{130, 1, 1, 97, 71}, {64, 64, 64, 100, 8}}},
        DocCase{4, 2, 16, {{5, 300, 17, 1, 200}}},
        // Many documents, across several tiles of every kernel.
        DocCase{4, 2, 64, {Cycle({1, 7, 64, 65, 200, 13, 128, 129, 3}, 1000)}},
        DocCase{4, 2, 128, {Cycle({300, 150, 450, 17, 1}, 1100)}},
        DocCase{2, 1, 64, {{1000, 1, 299}}}, DocCase{4, 4, 128, {{256, 128, 129, 7}}},
        DocCase{8, 2, 16, {Cycle({33, 1, 250}, 700), Cycle({64, 190}, 700)}},
        // Long documents: T = 8400 (the dK/dV blocks rank their key tiles by work), and
        // T = 16500, past what the mma.sync dK/dV blocks rank (256 key tiles of 64): they take
        // them in order, each counting its query tiles in rounds of 128.
        DocCase{2, 1, 64, {{100, 8300}}, false}, DocCase{2, 1, 64, {{100, 16400}}, false}),
    [](const ::testing::TestParamInfo<DocCase>& info) {
      const DocCase& c = info.param;
      return absl::StrCat("Case", info.index, "NH", c.nh, "NKV", c.nkv, "HS", c.hs, "T", c.t(),
                          "B", c.docs.size());
    });

// doc_starts all zero is one document a sequence: plain causal attention, and bit for bit
// the nullptr result (the same tiles in the same order, the same arithmetic), for every kernel
// and kAuto.
class FlashDocZeroTest : public FlashAttentionTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(FlashDocZeroTest, ZeroStartsAreBitwiseCausal) {
  const Shape s = GetParam();
  std::mt19937 rng(5 + s.t);
  const std::vector<uint16_t> qkv = RandomBf16(s.qkv_elems(), 1.0f, rng);
  const std::vector<uint16_t> dy = RandomBf16(s.elems(), 1.0f, rng);
  const std::vector<int32_t> zeros(static_cast<size_t>(s.b) * s.t, 0);
  std::vector<FlashAttentionKernel> kernels = KernelsAt(s.hs);
  kernels.push_back(FlashAttentionKernel::kAuto);
  for (const FlashAttentionKernel kernel : kernels) {
    SCOPED_TRACE(KernelName(kernel));
    const FlashOutputs causal = RunFlash(kernel, s, qkv, dy, nullptr, stream_);
    const FlashOutputs zero = RunFlash(kernel, s, qkv, dy, &zeros, stream_);
    EXPECT_EQ(zero.y, causal.y);
    EXPECT_EQ(zero.lse, causal.lse);
    EXPECT_EQ(zero.dqkv, causal.dqkv);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashDocZeroTest,
                         ::testing::Values(Shape{2, 4, 300, 64, 2}, Shape{1, 4, 200, 128, 2},
                                           Shape{1, 2, 77, 16, 1}, Shape{2, 2, 130, 32},
                                           Shape{1, 8, 1024, 64, 2}, Shape{1, 2, 513, 128}),
                         ShapeName);

// ---- Sliding window (Mistral: query t sees keys (t - window, t]) ----

// A window case: the shape, the window and optionally documents (lengths per sequence, as
// DocCase's; empty: no doc_starts).
struct WindowCase {
  Shape shape;
  int window;
  std::vector<std::vector<int>> docs;
};

class FlashWindowTest : public FlashAttentionTest,
                        public ::testing::WithParamInterface<WindowCase> {};

// Both kernels (mma.sync, and the Hopper ones where they run) with the window (and documents)
// against the double reference with the same mask, at the reference tolerances, and
// bit-deterministic. A window of T or more must be plain causal attention (the same call
// without a window, bit for bit). Where the window hides keys, the result must differ from
// plain causal's: a kernel ignoring the window would fail the reference check, and this says
// so more plainly.
TEST_P(FlashWindowTest, MatchesReferenceWithTheWindow) {
  const WindowCase& c = GetParam();
  const Shape s = c.shape;
  std::mt19937 rng(77 + s.t * 5 + s.hs + c.window);
  const std::vector<uint16_t> qkv = RandomBf16(s.qkv_elems(), 1.0f, rng);  // (B, T, W)
  const std::vector<uint16_t> dy = RandomBf16(s.elems(), 1.0f, rng);       // (B, T, C)
  std::vector<int32_t> starts;
  if (!c.docs.empty()) {
    ASSERT_EQ(static_cast<int>(c.docs.size()), s.b);
    starts = DocStartsOf(c.docs, s.t);
  }
  const std::vector<int32_t>* doc = c.docs.empty() ? nullptr : &starts;
  const Reference ref =
      ComputeReference(s, ToDouble(ToHeads(qkv, s, kQ)), ToDouble(ToHeads(qkv, s, kK)),
                       ToDouble(ToHeads(qkv, s, kV)), ToDouble(ToHeads(dy, s, kY)), doc, c.window);
  std::vector<FlashAttentionKernel> kernels = KernelsAt(s.hs);
  kernels.push_back(FlashAttentionKernel::kAuto);
  for (const FlashAttentionKernel kernel : kernels) {
    const char* name = KernelName(kernel);
    SCOPED_TRACE(name);
    const FlashOutputs out = RunFlash(kernel, s, qkv, dy, doc, stream_, c.window);
    const double r_y = RelError(ToHeads(out.y, s, kY), ref.y);
    const double r_lse = RelError(out.lse, ref.lse);
    const double r_dq = RelError(ToHeads(out.dqkv, s, kQ), ref.dq);
    const double r_dk = RelError(ToHeads(out.dqkv, s, kK), ref.dk);
    const double r_dv = RelError(ToHeads(out.dqkv, s, kV), ref.dv);
    std::printf(
        "%s window %d%s B=%d NH=%d NKV=%d T=%d HS=%d: y %.2e lse %.2e dq %.2e dk %.2e "
        "dv %.2e\n",
        name, c.window, doc != nullptr ? " + docs" : "", s.b, s.nh, s.kv(), s.t, s.hs, r_y, r_lse,
        r_dq, r_dk, r_dv);
    EXPECT_LE(r_y, kTolY);
    EXPECT_LE(r_lse, kTolLse);
    EXPECT_LE(r_dq, kTolDqDk);
    EXPECT_LE(r_dk, kTolDqDk);
    EXPECT_LE(r_dv, kTolDv);
    const FlashOutputs again = RunFlash(kernel, s, qkv, dy, doc, stream_, c.window);
    EXPECT_EQ(again.y, out.y);  // deterministic
    EXPECT_EQ(again.lse, out.lse);
    EXPECT_EQ(again.dqkv, out.dqkv);
    const FlashOutputs unwindowed = RunFlash(kernel, s, qkv, dy, doc, stream_, 0);
    if (c.window >= s.t) {
      EXPECT_EQ(out.y, unwindowed.y);
      EXPECT_EQ(out.lse, unwindowed.lse);
      EXPECT_EQ(out.dqkv, unwindowed.dqkv);
    } else {
      EXPECT_NE(out.lse, unwindowed.lse);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Windows, FlashWindowTest,
    ::testing::Values(
        // Grouped-query (NH 4, NKV 2), T not a multiple of any tile, windows of a few tiles.
        WindowCase{Shape{1, 4, 300, 64, 2}, 100, {}}, WindowCase{Shape{1, 4, 300, 128, 2}, 100, {}},
        WindowCase{Shape{2, 4, 777, 64, 2}, 200, {}},
        WindowCase{Shape{1, 4, 1100, 128, 2}, 256, {}},
        // Windows smaller than a tile (of 16 rows, too), down to two keys (not one: its exact
        // dq and dk are 0, which a relative error cannot weigh).
        WindowCase{Shape{1, 4, 200, 64, 2}, 17, {}}, WindowCase{Shape{1, 4, 200, 128, 2}, 17, {}},
        WindowCase{Shape{1, 2, 130, 64}, 2, {}}, WindowCase{Shape{1, 2, 130, 128}, 5, {}},
        // A window of T - 1 (one key hidden from the last query), then T and more: plain causal.
        WindowCase{Shape{1, 4, 150, 64, 2}, 149, {}}, WindowCase{Shape{1, 4, 150, 64, 2}, 150, {}},
        WindowCase{Shape{1, 4, 150, 128, 2}, 1000, {}},
        // Windows of 1024 keys and more without documents: the forward and dQ kernels take the
        // causal query tiles at HS 64 and 128 (and windows up to 1023 the documents' ones), the
        // Hopper dK/dV kernel its long-window build (walks cut by formula, the mask by compare);
        // the longest ones with key tiles whose walks the window ends well before T.
        WindowCase{Shape{1, 4, 1500, 64, 2}, 1024, {}},
        WindowCase{Shape{1, 4, 1500, 128, 2}, 1023, {}},
        WindowCase{Shape{2, 2, 1300, 128, 1}, 1100, {}},
        WindowCase{Shape{1, 4, 2900, 64, 2}, 1200, {}},
        WindowCase{Shape{1, 4, 3001, 128, 2}, 1030, {}},
        // The other head sizes (mma.sync only).
        WindowCase{Shape{1, 4, 300, 32, 2}, 70, {}}, WindowCase{Shape{2, 2, 100, 16, 1}, 33, {}},
        // With documents: windows shorter and longer than the documents.
        WindowCase{Shape{2, 4, 340, 64, 2}, 50, {{1, 7, 64, 65, 200, 3}, {200, 1, 139}}},
        WindowCase{Shape{2, 4, 340, 128, 2}, 150, {{1, 7, 64, 65, 200, 3}, {200, 1, 139}}},
        WindowCase{Shape{1, 4, 1000, 64, 2}, 90, {Cycle({300, 150, 450, 17, 1}, 1000)}},
        WindowCase{Shape{1, 4, 1000, 128, 2}, 300, {Cycle({1, 7, 64, 700, 13, 128}, 1000)}},
        WindowCase{Shape{1, 4, 300, 64, 2}, 300, {{100, 200}}}),
    [](const ::testing::TestParamInfo<WindowCase>& info) {
      const WindowCase& c = info.param;
      const Shape& s = c.shape;
      return absl::StrCat("Case", info.index, "B", s.b, "NH", s.nh, "NKV", s.kv(), "T", s.t, "HS",
                          s.hs, "W", c.window, c.docs.empty() ? "" : "Docs");
    });

// A long sequence, T = 16500: past the 256 key tiles the dK/dV blocks rank (PlanKeyTile), they
// take their key tiles in order and count the query tiles that see them in rounds. Two
// windows: one on the documents' query tiles (300), one on the causal ones (1100, LongWalks).
TEST_F(FlashAttentionTest, LongSequenceWindowMatchesReference) {
  const Shape s{1, 1, 16500, 64, 1};
  std::mt19937 rng(4242);
  const std::vector<uint16_t> qkv = RandomBf16(s.qkv_elems(), 1.0f, rng);
  const std::vector<uint16_t> dy = RandomBf16(s.elems(), 1.0f, rng);
  for (const int window : {300, 1100}) {
    const Reference ref = ComputeReference(
        s, ToDouble(ToHeads(qkv, s, kQ)), ToDouble(ToHeads(qkv, s, kK)),
        ToDouble(ToHeads(qkv, s, kV)), ToDouble(ToHeads(dy, s, kY)), nullptr, window);
    for (const FlashAttentionKernel kernel : KernelsAt(s.hs)) {
      SCOPED_TRACE(absl::StrCat(KernelName(kernel), " window ", window));
      const FlashOutputs out = RunFlash(kernel, s, qkv, dy, nullptr, stream_, window);
      EXPECT_LE(RelError(ToHeads(out.y, s, kY), ref.y), kTolY);
      EXPECT_LE(RelError(out.lse, ref.lse), kTolLse);
      EXPECT_LE(RelError(ToHeads(out.dqkv, s, kQ), ref.dq), kTolDqDk);
      EXPECT_LE(RelError(ToHeads(out.dqkv, s, kK), ref.dk), kTolDqDk);
      EXPECT_LE(RelError(ToHeads(out.dqkv, s, kV), ref.dv), kTolDv);
    }
  }
}

// The cuBLAS + softmax fallback's softmax ops with a window (alone and with documents) on
// random raw scores, against the softmax in double with the same mask: P to bf16 accuracy and
// exactly 0 outside the row's keys, lse to fp32, the recompute bit for bit the forward's P, the
// backward against scale * P * (dP - sum P dP) over the row's keys.
TEST_F(FlashAttentionTest, SoftmaxFallbackWithWindow) {
  constexpr int kB = 2, kNh = 2, kT = 136;
  constexpr float kScale = 0.125f;
  const int64_t rows = int64_t{kB} * kNh * kT;
  const std::vector<std::vector<int>> docs = {{1, 40, 70, 25}, {136}};
  const std::vector<int32_t> host_starts = DocStartsOf(docs, kT);
  DeviceBuffer<int32_t> d_starts(host_starts);
  for (const int window : {1, 9, 50, 135}) {
    for (const bool with_docs : {false, true}) {
      SCOPED_TRACE(absl::StrCat("window ", window, with_docs ? " + docs" : ""));
      std::mt19937 rng(11 + window);
      const std::vector<uint16_t> scores = RandomBf16(rows * kT, 3.0f, rng);
      const std::vector<uint16_t> dp = RandomBf16(rows * kT, 1.0f, rng);
      const int32_t* starts = with_docs ? d_starts.get() : nullptr;
      DeviceBuffer<uint16_t> d_att(scores), d_again(scores), d_datt(dp);
      DeviceBuffer<float> d_lse(std::vector<float>(rows, NAN));
      ASSERT_TRUE(CausalSoftmaxForward(AsBf16(d_att), d_lse.get(), starts, window, rows, kT, kNh,
                                       kScale, stream_)
                      .ok());
      ASSERT_TRUE(CausalSoftmaxRecompute(AsBf16(d_again), d_lse.get(), starts, window, rows, kT,
                                         kNh, kScale, stream_)
                      .ok());
      ASSERT_TRUE(CausalSoftmaxBackward(AsBf16(d_datt), AsBf16(d_att), starts, window, rows, kT,
                                        kNh, kScale, stream_)
                      .ok());
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      const std::vector<uint16_t> p = d_att.ToHost();
      const std::vector<float> lse = d_lse.ToHost();
      const std::vector<uint16_t> ds = d_datt.ToHost();
      EXPECT_EQ(d_again.ToHost(), p);
      std::vector<double> ref_p(rows * kT, 0.0), ref_ds(rows * kT, 0.0), ref_lse(rows);
      int64_t outside_nonzero = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const int pos = static_cast<int>(r % kT);
        int j0 = with_docs ? host_starts[(r / (kNh * kT)) * kT + pos] : 0;
        j0 = std::max(j0, pos - window + 1);
        const auto scaled = [&](int j) {
          return double{kScale} * FromBf16Bits(scores[r * kT + j]);
        };
        double mx = -INFINITY;
        for (int j = j0; j <= pos; ++j) mx = std::max(mx, scaled(j));
        double sum = 0.0;
        for (int j = j0; j <= pos; ++j) sum += std::exp(scaled(j) - mx);
        ref_lse[r] = mx + std::log(sum);
        double dot = 0.0;
        for (int j = j0; j <= pos; ++j) {
          ref_p[r * kT + j] = std::exp(scaled(j) - ref_lse[r]);
          // The backward takes the GPU's bf16 P, as the model's does.
          dot += double{FromBf16Bits(p[r * kT + j])} * FromBf16Bits(dp[r * kT + j]);
        }
        for (int j = j0; j <= pos; ++j) {
          ref_ds[r * kT + j] =
              kScale * double{FromBf16Bits(p[r * kT + j])} * (FromBf16Bits(dp[r * kT + j]) - dot);
        }
        for (int j = 0; j < kT; ++j) {
          if (j >= j0 && j <= pos) continue;
          outside_nonzero += p[r * kT + j] != 0 || ds[r * kT + j] != 0;
        }
      }
      EXPECT_EQ(outside_nonzero, 0);
      EXPECT_LE(RelError(p, ref_p), 1e-2);
      EXPECT_LE(RelError(lse, ref_lse), kTolLse);
      EXPECT_LE(RelError(ds, ref_ds), 1e-2);
    }
  }
}

// Rejected before any GPU work, so this runs without a device too.
TEST(FlashAttentionArgs, RejectsBadArguments) {
  alignas(16) static uint16_t dummy[64];
  bf16* p = reinterpret_cast<bf16*>(dummy);
  float* f = reinterpret_cast<float*>(dummy);
  bf16* p2 = p + 32;  // a second, distinct 16-byte aligned pointer
  EXPECT_EQ(FlashAttentionForward(p, f, p, nullptr, 0, 1, 1, 1, 8, 48, nullptr).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(FlashAttentionSupported(48));
  EXPECT_EQ(FlashAttentionForward(p, f, nullptr, nullptr, 0, 1, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FlashAttentionForward(p, f, p, nullptr, 0, 1, 1, 1, 0, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FlashAttentionForward(p + 1, f, p, nullptr, 0, 1, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // y not 16-byte aligned
  EXPECT_EQ(FlashAttentionForward(p, f, p + 4, nullptr, 0, 1, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // qkv not 16-byte aligned
  EXPECT_EQ(
      FlashAttentionBackward(p2, p, p, f, p, nullptr, 0, nullptr, 1, 1, 1, 8, 64, nullptr).code(),
      absl::StatusCode::kInvalidArgument);  // no scratch
  EXPECT_EQ(FlashAttentionBackward(p, p, p, f, p, nullptr, 0, f, 1, 1, 1, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // dqkv aliases qkv
  EXPECT_EQ(FlashAttentionBackward(p2, p, p, f, p, nullptr, 0, f, 1, 1, 1, 8, 96, nullptr).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(FlashAttentionForward(p, f, p, nullptr, 0, 1, 4, 3, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // nkv does not divide nh
  EXPECT_EQ(FlashAttentionBackward(p2, p, p, f, p, nullptr, 0, f, 1, 4, 0, 8, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // nkv = 0
  // The Hopper kernel is HS 64 and 128 only; asked for at 32 it says so instead of running
  // another.
  const absl::Status hopper = FlashAttentionForwardWith(FlashAttentionKernel::kHopper, p, f, p,
                                                        nullptr, 0, 1, 1, 1, 8, 32, nullptr);
  EXPECT_EQ(hopper.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(hopper.message().find("head size 64 or 128"), std::string::npos) << hopper.message();
  EXPECT_FALSE(FlashAttentionHopperForward(32));
  EXPECT_FALSE(FlashAttentionHopperForward(16));
  const absl::Status hopper_backward = FlashAttentionBackwardWith(
      FlashAttentionKernel::kHopper, p2, p, p, f, p, nullptr, 0, f, 1, 1, 1, 8, 32, nullptr);
  EXPECT_EQ(hopper_backward.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(hopper_backward.message().find("head size 64 or 128"), std::string::npos)
      << hopper_backward.message();
  // A negative window is refused, by every entry point, naming it.
  const absl::Status negative[] = {
      FlashAttentionForward(p, f, p, nullptr, -1, 1, 1, 1, 8, 64, nullptr),
      FlashAttentionForwardWith(FlashAttentionKernel::kMmaSync, p, f, p, nullptr, -4096, 1, 1, 1, 8,
                                64, nullptr),
      FlashAttentionBackward(p2, p, p, f, p, nullptr, -1, f, 1, 1, 1, 8, 64, nullptr),
      FlashAttentionBackwardWith(FlashAttentionKernel::kMmaSync, p2, p, p, f, p, nullptr, -2, f, 1,
                                 1, 1, 8, 64, nullptr),
      CausalSoftmaxForward(p, f, nullptr, -1, 16, 8, 1, 1.0f, nullptr),
      CausalSoftmaxRecompute(p, f, nullptr, -1, 16, 8, 1, 1.0f, nullptr),
      CausalSoftmaxBackward(p2, p, nullptr, -1, 16, 8, 1, 1.0f, nullptr)};
  for (const absl::Status& status : negative) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("window"), std::string::npos) << status.message();
  }
}

// Not a check: prints forward and backward times of one layer's attention at shape `s`.
void PrintTiming(const Shape& s, cudaStream_t stream) {
  std::mt19937 rng(7);
  const auto x = RandomBf16(s.elems(), 1.0f, rng);
  const auto xw = RandomBf16(s.qkv_elems(), 1.0f, rng);
  DeviceBuffer<uint16_t> d_qkv(xw), d_dqkv(xw), d_dy(x), d_y(x);
  DeviceBuffer<float> d_lse(std::vector<float>(s.heads() * s.t));
  DeviceBuffer<float> d_scratch(
      std::vector<float>(FlashAttentionBackwardScratchFloats(s.b, s.nh, s.t, s.hs)));
  const auto forward = [&] {
    return FlashAttentionForward(AsBf16(d_y), d_lse.get(), AsBf16(d_qkv), nullptr, 0, s.b, s.nh,
                                 s.kv(), s.t, s.hs, stream);
  };
  const auto forward_sync = [&] {
    return FlashAttentionForwardWith(FlashAttentionKernel::kMmaSync, AsBf16(d_y), d_lse.get(),
                                     AsBf16(d_qkv), nullptr, 0, s.b, s.nh, s.kv(), s.t, s.hs,
                                     stream);
  };
  const auto backward = [&] {
    return FlashAttentionBackward(AsBf16(d_dqkv), AsBf16(d_dy), AsBf16(d_y), d_lse.get(),
                                  AsBf16(d_qkv), nullptr, 0, d_scratch.get(), s.b, s.nh, s.kv(),
                                  s.t, s.hs, stream);
  };
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  constexpr int kIters = 20;
  float ms[3];
  const auto op = [&](int which) {
    return which == 0 ? forward() : which == 1 ? backward() : forward_sync();
  };
  for (int which = 0; which < 3; ++which) {
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(op(which).ok());
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < kIters; ++i) ASSERT_TRUE(op(which).ok());
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&ms[which], start, stop));
    ms[which] /= kIters;
  }
  // Causal FLOPs: 2 GEMMs forward, 7 backward (S and dP are computed twice), each 2 * HS
  // multiply-adds over the T (T + 1) / 2 visible pairs of every head.
  const double gemm = 2.0 * s.hs * s.heads() * s.t * (s.t + 1) / 2.0;
  std::printf("flash attention B=%d NH=%d NKV=%d T=%d HS=%d: forward %.3f ms (%.0f TFLOP/s), "
              "backward %.3f ms (%.0f TFLOP/s), mma.sync forward %.3f ms (%.0f TFLOP/s)\n",
              s.b, s.nh, s.kv(), s.t, s.hs, ms[0], 2 * gemm / ms[0] * 1e-9, ms[1],
              7 * gemm / ms[1] * 1e-9, ms[2], 2 * gemm / ms[2] * 1e-9);
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
}

// GPT-2 124M (B = 16, NH = 12, T = 1024, HS = 64), for the record.
TEST_F(FlashAttentionTest, TimingGpt2Shape) { PrintTiming(Shape{16, 12, 1024, 64}, stream_); }

// Llama-3.2-1B-like (B = 8, NH = 32, NKV = 8, T = 2048, HS = 64), for the record.
TEST_F(FlashAttentionTest, TimingLlama1bShape) {
  PrintTiming(Shape{8, 32, 2048, 64, 8}, stream_);
}

}  // namespace
}  // namespace weft::engine::cuda
