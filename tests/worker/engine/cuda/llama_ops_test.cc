// Llama's CUDA layers (worker/engine/cuda/{rmsnorm,rope,swiglu,encoder}.cu), each forward and
// backward against a host reference computed here in double on the same bf16 inputs, and
// Qwen3's q/k norm (qk_norm.cu) against the CPU op (cpu::QkNorm*) in float on the same bf16
// inputs, one test per kernel so a failure names it. Outputs written (=) are prefilled with
// garbage (a missed write shows); outputs accumulated (+=) are prefilled with values the
// reference adds to.
//
// Error metric per tensor: max_i |gpu_i - ref_i| / max_i |ref_i|. Tolerances:
//  - bf16 outputs: 1e-2 (one bf16 rounding is 2^-9 relative; the residual-stream gradient
//    dinp += also rounds the prefill + update sum once);
//  - fp32 statistics (rstd) and the fp32 rotary tables: 1e-5 (fp32 sums vs double);
//  - fp32 parameter gradients (RMSNorm dweight, embedding dwte, the q/k norm's weights):
//    1e-4 (fp32 sums of products of bf16 values, in a different order than the reference: over
//    <= 64 rows, or, the q/k norm, up to 32K heads, whose sums grow as their square root while
//    the rounding errors of both orders stay near 1e-6 of them).
// The RMSNorm and q/k norm backwards are also checked bit-deterministic; rotary embeddings
// with positions (packed documents) bit for bit against each document rotated on its own.
// Skips without a GPU, except the argument checks.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/worker/engine/cuda/cuda_test_util.h"
#include "worker/engine/cpu/ops.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

constexpr double kTolBf16 = 1e-2;
constexpr double kTolStat = 1e-5;
constexpr double kTolGrad = 1e-4;

using test_util::DeviceBuffer;
using test_util::kGarbageBits;

bf16* AsBf16(DeviceBuffer<uint16_t>& buf) { return buf.bf16(); }

double Val(uint16_t bits) { return test_util::FromBf16Bits(bits); }
double Val(float x) { return x; }

// max |gpu - ref| / max |ref| (infinite if the GPU produced a non-finite value).
template <typename T>
double RelError(const std::vector<T>& gpu, const std::vector<double>& ref) {
  EXPECT_EQ(gpu.size(), ref.size());
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < std::min(gpu.size(), ref.size()); ++i) {
    const double g = Val(gpu[i]);
    err = std::isfinite(g) ? std::max(err, std::abs(g - ref[i])) : INFINITY;
    mag = std::max(mag, std::abs(ref[i]));
  }
  return err / std::max(mag, 1e-30);
}

class LlamaOpsTest : public test_util::CudaStreamTest {
 protected:
  LlamaOpsTest() : CudaStreamTest("Llama's CUDA ops") {}
};

// ---- RMSNorm ----

struct RmsCase {
  int n, c;
  float eps;
};

// rstd (N) and out (N, C) in double.
void RmsReference(const RmsCase& k, const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                  std::vector<double>* rstd, std::vector<double>* out) {
  rstd->assign(k.n, 0.0);
  out->assign(static_cast<size_t>(k.n) * k.c, 0.0);
  for (int r = 0; r < k.n; ++r) {
    double sq = 0.0;
    for (int j = 0; j < k.c; ++j) sq += Val(x[r * k.c + j]) * Val(x[r * k.c + j]);
    (*rstd)[r] = 1.0 / std::sqrt(sq / k.c + k.eps);
    for (int j = 0; j < k.c; ++j) {
      (*out)[r * k.c + j] = Val(x[r * k.c + j]) * (*rstd)[r] * Val(w[j]);
    }
  }
}

void CheckRmsNormForward(const RmsCase& k, cudaStream_t stream) {
  SCOPED_TRACE(testing::Message() << "n " << k.n << " c " << k.c);
  std::mt19937 rng(1);
  const auto x = test_util::RandomBf16Bits(static_cast<size_t>(k.n) * k.c, 2.0f, rng, 0.5f);
  const auto w = test_util::RandomBf16Bits(k.c, 0.3f, rng, 1.0f);
  std::vector<double> rstd, out;
  RmsReference(k, x, w, &rstd, &out);
  DeviceBuffer<uint16_t> d_x(x), d_w(w);
  DeviceBuffer<uint16_t> d_out(std::vector<uint16_t>(x.size(), kGarbageBits));
  DeviceBuffer<float> d_rstd(std::vector<float>(k.n, -1.0f));
  ASSERT_TRUE(RmsNormForward(AsBf16(d_out), d_rstd.get(), AsBf16(d_x), AsBf16(d_w), k.n, k.c,
                             k.eps, stream)
                  .ok());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_LE(RelError(d_out.ToHost(), out), kTolBf16);
  EXPECT_LE(RelError(d_rstd.ToHost(), rstd), kTolStat);
}

// A block per row up to 8192 wide: 320 (the last of 2 warps partly idle) and a whole
// 1024-thread block; wider, a warp per row (16392: its lanes hold 64 or 65 vectors).
TEST_F(LlamaOpsTest, RmsNormForwardMatchesReference) {
  CheckRmsNormForward({37, 320, 1e-5f}, stream_);
  CheckRmsNormForward({5, 8192, 1e-5f}, stream_);
  CheckRmsNormForward({3, 16392, 1e-5f}, stream_);
}

void CheckRmsNormBackward(const RmsCase& k, cudaStream_t stream) {
  SCOPED_TRACE(testing::Message() << "n " << k.n << " c " << k.c);
  std::mt19937 rng(2);
  const size_t nc = static_cast<size_t>(k.n) * k.c;
  const auto x = test_util::RandomBf16Bits(nc, 1.0f, rng);
  const auto w = test_util::RandomBf16Bits(k.c, 0.3f, rng, 1.0f);
  const auto dy = test_util::RandomBf16Bits(nc, 1.0f, rng);
  // The residual stream's gradient so far.
  const auto dinp0 = test_util::RandomBf16Bits(nc, 0.5f, rng);
  std::mt19937_64 rng64(3);
  const std::vector<float> dw0 = test_util::Random(rng64, k.c);
  std::vector<double> rstd, out;
  RmsReference(k, x, w, &rstd, &out);
  // dx = rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd; dw = sum_rows dy xhat.
  std::vector<double> dinp(nc), dw(k.c);
  for (int j = 0; j < k.c; ++j) dw[j] = dw0[j];
  for (int r = 0; r < k.n; ++r) {
    double dot = 0.0;
    for (int j = 0; j < k.c; ++j) {
      dot += Val(dy[r * k.c + j]) * Val(w[j]) * Val(x[r * k.c + j]) * rstd[r];
    }
    dot /= k.c;
    for (int j = 0; j < k.c; ++j) {
      const size_t i = static_cast<size_t>(r) * k.c + j;
      const double xhat = Val(x[i]) * rstd[r];
      dinp[i] = Val(dinp0[i]) + rstd[r] * (Val(dy[i]) * Val(w[j]) - xhat * dot);
      dw[j] += Val(dy[i]) * xhat;
    }
  }
  std::vector<float> rstd_f(rstd.begin(), rstd.end());
  DeviceBuffer<uint16_t> d_x(x), d_w(w), d_dy(dy), d_dinp(dinp0);
  DeviceBuffer<float> d_rstd(rstd_f), d_dw(dw0);
  DeviceBuffer<float> d_scratch(std::vector<float>(RmsNormBackwardScratchFloats(k.n, k.c)));
  ASSERT_TRUE(RmsNormBackward(AsBf16(d_dinp), d_dw.get(), AsBf16(d_dy), AsBf16(d_x),
                              AsBf16(d_w), d_rstd.get(), d_scratch.get(), k.n, k.c, stream)
                  .ok());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_LE(RelError(d_dinp.ToHost(), dinp), kTolBf16);
  const std::vector<float> dw1 = d_dw.ToHost();
  EXPECT_LE(RelError(dw1, dw), kTolGrad);

  // Deterministic: the same accumulation again from the same start gives the same bits.
  DeviceBuffer<uint16_t> d_dinp2(dinp0);
  DeviceBuffer<float> d_dw2(dw0);
  ASSERT_TRUE(RmsNormBackward(AsBf16(d_dinp2), d_dw2.get(), AsBf16(d_dy), AsBf16(d_x),
                              AsBf16(d_w), d_rstd.get(), d_scratch.get(), k.n, k.c, stream)
                  .ok());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(d_dw2.ToHost(), dw1);
}

// The one-pass backward with a lane a row (64 and 2000 rows of 264, two warps a row), over
// several rounds of rows (1000 of 4096: 256 lanes of a block each; 300 of 8192: 128 lanes of
// 1024 threads), then the two-kernel backward at Llama-3.1-405B's width and wider, over one
// slab and several: it keeps nothing per row in shared memory, so no width is too wide.
TEST_F(LlamaOpsTest, RmsNormBackwardAccumulatesTheReferenceGradients) {
  CheckRmsNormBackward({64, 264, 1e-6f}, stream_);
  CheckRmsNormBackward({2000, 264, 1e-6f}, stream_);
  CheckRmsNormBackward({1000, 4096, 1e-5f}, stream_);
  CheckRmsNormBackward({300, 8192, 1e-5f}, stream_);
  CheckRmsNormBackward({5, 8192, 1e-5f}, stream_);
  CheckRmsNormBackward({200, 16384, 1e-5f}, stream_);
  CheckRmsNormBackward({3, 16384, 1e-5f}, stream_);
  CheckRmsNormBackward({2, 32768, 1e-5f}, stream_);
}

// ---- rotary embeddings ----

struct RopeCase {
  int b, t, nh, nkv, hs;
  int width() const { return (nh + 2 * nkv) * hs; }
  size_t elems() const { return static_cast<size_t>(b) * t * width(); }
};

// inv_freq[i] = theta^(-2i / hs) in fp32, as the model uploads it.
std::vector<float> InvFreq(int hs, double theta) {
  std::vector<float> f(hs / 2);
  for (int i = 0; i < hs / 2; ++i) f[i] = static_cast<float>(std::pow(theta, -2.0 * i / hs));
  return f;
}

// The angle as the kernel forms it (fp32 product), its cos and sin in double.
double Angle(int pos, float inv_freq) { return static_cast<float>(pos) * inv_freq; }

// Rotates the q and k heads of qkv (B, T, W) by sign * angle (HF rotate-half pairing).
std::vector<double> RopeReference(const RopeCase& k, const std::vector<uint16_t>& qkv,
                                  const std::vector<float>& inv_freq, int sign) {
  std::vector<double> out(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) out[i] = Val(qkv[i]);
  const int half = k.hs / 2;
  for (int r = 0; r < k.b * k.t; ++r) {
    const int pos = r % k.t;
    for (int h = 0; h < k.nh + k.nkv; ++h) {
      const size_t base = static_cast<size_t>(r) * k.width() + static_cast<size_t>(h) * k.hs;
      for (int i = 0; i < half; ++i) {
        const double a = Angle(pos, inv_freq[i]);
        const double c = std::cos(a), s = sign * std::sin(a);
        const double x1 = Val(qkv[base + i]), x2 = Val(qkv[base + i + half]);
        out[base + i] = x1 * c - x2 * s;
        out[base + i + half] = x2 * c + x1 * s;
      }
    }
  }
  return out;
}

class RopeTest : public LlamaOpsTest, public ::testing::WithParamInterface<RopeCase> {
 protected:
  // Builds the tables for max_t = T on the device from inv_freq and checks them.
  void BuildTables(const RopeCase& k, const std::vector<float>& inv_freq) {
    const int half = k.hs / 2;
    d_inv_ = std::make_unique<DeviceBuffer<float>>(inv_freq);
    d_cos_ = std::make_unique<DeviceBuffer<float>>(std::vector<float>(k.t * half, -9.0f));
    d_sin_ = std::make_unique<DeviceBuffer<float>>(std::vector<float>(k.t * half, -9.0f));
    ASSERT_TRUE(RopeTables(d_cos_->get(), d_sin_->get(), d_inv_->get(), k.t, half, stream_).ok());
    Sync();
    std::vector<double> cos_ref(k.t * half), sin_ref(k.t * half);
    for (int p = 0; p < k.t; ++p) {
      for (int i = 0; i < half; ++i) {
        cos_ref[p * half + i] = std::cos(Angle(p, inv_freq[i]));
        sin_ref[p * half + i] = std::sin(Angle(p, inv_freq[i]));
      }
    }
    EXPECT_LE(RelError(d_cos_->ToHost(), cos_ref), kTolStat);
    EXPECT_LE(RelError(d_sin_->ToHost(), sin_ref), kTolStat);
  }
  std::unique_ptr<DeviceBuffer<float>> d_inv_, d_cos_, d_sin_;
};

// Forward (sign +1) and backward (-1) in place: q and k heads rotated, v bit-identical.
TEST_P(RopeTest, RotatesQAndKInPlaceAndLeavesV) {
  const RopeCase k = GetParam();
  std::mt19937 rng(4);
  const auto qkv = test_util::RandomBf16Bits(k.elems(), 1.0f, rng);
  const std::vector<float> inv_freq = InvFreq(k.hs, 500000.0);
  BuildTables(k, inv_freq);
  for (int sign : {1, -1}) {
    SCOPED_TRACE(sign > 0 ? "forward" : "backward");
    DeviceBuffer<uint16_t> d_qkv(qkv);
    const auto launch = sign > 0 ? RopeForward : RopeBackward;
    ASSERT_TRUE(launch(AsBf16(d_qkv), nullptr, d_cos_->get(), d_sin_->get(), k.b, k.t, k.nh,
                       k.nkv, k.hs, stream_)
                    .ok());
    Sync();
    const std::vector<uint16_t> got = d_qkv.ToHost();
    EXPECT_LE(RelError(got, RopeReference(k, qkv, inv_freq, sign)), kTolBf16);
    for (int r = 0; r < k.b * k.t; ++r) {  // v untouched, bit for bit
      const size_t v0 = static_cast<size_t>(r) * k.width() + (k.nh + k.nkv) * k.hs;
      for (int j = 0; j < k.nkv * k.hs; ++j) ASSERT_EQ(got[v0 + j], qkv[v0 + j]) << "row " << r;
    }
  }
}

// With positions (packed documents: positions[b, t] = t - its document's start), forward and
// backward equal rotating each document on its own from position 0 (a sequence of its own
// length, no positions), bit for bit: the same table rows, the same arithmetic. positions = t
// is bit for bit the plain rotation (nullptr).
TEST_P(RopeTest, PositionsRestartEachDocument) {
  const RopeCase k = GetParam();
  std::mt19937 rng(8);
  const auto qkv = test_util::RandomBf16Bits(k.elems(), 1.0f, rng);
  BuildTables(k, InvFreq(k.hs, 500000.0));
  // Documents of 1, 5, 16, 2, 40 ... tokens per sequence (a different cut in each), the last
  // one cut at T.
  const int pattern[] = {1, 5, 16, 2, 40, 3};
  std::vector<int32_t> positions(static_cast<size_t>(k.b) * k.t), plain(positions.size());
  std::vector<std::pair<int, int>> docs;  // (first row b * T + start, length)
  for (int b = 0; b < k.b; ++b) {
    for (int start = 0, i = b; start < k.t; ++i) {
      const int len = std::min(pattern[i % 6], k.t - start);
      docs.emplace_back(b * k.t + start, len);
      for (int j = 0; j < len; ++j) positions[static_cast<size_t>(b) * k.t + start + j] = j;
      start += len;
    }
    for (int t = 0; t < k.t; ++t) plain[static_cast<size_t>(b) * k.t + t] = t;
  }
  DeviceBuffer<int32_t> d_positions(positions), d_plain(plain);
  const size_t w = k.width();
  for (int sign : {1, -1}) {
    SCOPED_TRACE(sign > 0 ? "forward" : "backward");
    const auto launch = sign > 0 ? RopeForward : RopeBackward;
    DeviceBuffer<uint16_t> d_packed(qkv);
    ASSERT_TRUE(launch(AsBf16(d_packed), d_positions.get(), d_cos_->get(), d_sin_->get(), k.b,
                       k.t, k.nh, k.nkv, k.hs, stream_)
                    .ok());
    Sync();
    const std::vector<uint16_t> packed = d_packed.ToHost();
    for (const auto& [row0, len] : docs) {
      const std::vector<uint16_t> doc(qkv.begin() + row0 * w, qkv.begin() + (row0 + len) * w);
      DeviceBuffer<uint16_t> d_doc(doc);
      ASSERT_TRUE(launch(AsBf16(d_doc), nullptr, d_cos_->get(), d_sin_->get(), 1, len, k.nh,
                         k.nkv, k.hs, stream_)
                      .ok());
      Sync();
      const std::vector<uint16_t> alone = d_doc.ToHost();
      ASSERT_TRUE(std::equal(alone.begin(), alone.end(), packed.begin() + row0 * w))
          << "document at row " << row0 << " of length " << len;
    }
    DeviceBuffer<uint16_t> d_with_t(qkv), d_without(qkv);
    ASSERT_TRUE(launch(AsBf16(d_with_t), d_plain.get(), d_cos_->get(), d_sin_->get(), k.b, k.t,
                       k.nh, k.nkv, k.hs, stream_)
                    .ok());
    ASSERT_TRUE(launch(AsBf16(d_without), nullptr, d_cos_->get(), d_sin_->get(), k.b, k.t, k.nh,
                       k.nkv, k.hs, stream_)
                    .ok());
    Sync();
    EXPECT_EQ(d_with_t.ToHost(), d_without.ToHost());
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(RopeCase{2, 37, 4, 2, 64}, RopeCase{1, 300, 8, 2, 128},
                                           RopeCase{1, 9, 2, 2, 16}),
                         [](const ::testing::TestParamInfo<RopeCase>& info) {
                           const RopeCase& k = info.param;
                           return "T" + std::to_string(k.t) + "NH" + std::to_string(k.nh) +
                                  "NKV" + std::to_string(k.nkv) + "HS" + std::to_string(k.hs);
                         });

// ---- Qwen3's q/k norm, against cpu::QkNormForward / QkNormBackward in float ----

struct QkNormCase {
  int n, nh, nkv, hs;
  int heads() const { return nh + nkv; }
  int width() const { return (nh + 2 * nkv) * hs; }
  size_t elems() const { return static_cast<size_t>(n) * width(); }
  size_t raw_elems() const { return static_cast<size_t>(n) * heads() * hs; }
};
constexpr float kQkEps = 1e-6f;  // Qwen3's rms_norm_eps

std::vector<float> ToFloats(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = test_util::FromBf16Bits(bits[i]);
  return out;
}

std::vector<double> ToDoubles(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// v (the last NKV heads of every row) bit for bit as `want`'s.
void ExpectVUntouched(const QkNormCase& k, const std::vector<uint16_t>& got,
                      const std::vector<uint16_t>& want) {
  for (int r = 0; r < k.n; ++r) {
    const size_t v0 = static_cast<size_t>(r) * k.width() + k.heads() * k.hs;
    for (int j = 0; j < k.nkv * k.hs; ++j) ASSERT_EQ(got[v0 + j], want[v0 + j]) << "row " << r;
  }
}

class QkNormTest : public LlamaOpsTest, public ::testing::WithParamInterface<QkNormCase> {};

// In place: q and k heads as the CPU op's within one bf16 rounding, v bit-identical; qk_raw is
// the input's q | k bit for bit, and leaving it out (nullptr) changes nothing else.
TEST_P(QkNormTest, ForwardNormalizesQAndKHeadsAndKeepsThemRaw) {
  const QkNormCase k = GetParam();
  std::mt19937 rng(11);
  const auto qkv = test_util::RandomBf16Bits(k.elems(), 2.0f, rng, 0.5f);
  const auto wq = test_util::RandomBf16Bits(k.hs, 0.3f, rng, 1.0f);
  const auto wk = test_util::RandomBf16Bits(k.hs, 0.3f, rng, 1.0f);
  std::vector<float> ref = ToFloats(qkv), raw_ref(k.raw_elems()), rrms(k.n * k.heads());
  cpu::QkNormForward(ref.data(), raw_ref.data(), rrms.data(), ToFloats(wq).data(),
                     ToFloats(wk).data(), k.n, k.nh, k.nkv, k.hs, kQkEps);

  DeviceBuffer<uint16_t> d_qkv(qkv), d_wq(wq), d_wk(wk);
  DeviceBuffer<uint16_t> d_raw(std::vector<uint16_t>(k.raw_elems(), kGarbageBits));
  ASSERT_TRUE(QkNormForward(AsBf16(d_qkv), AsBf16(d_raw), AsBf16(d_wq), AsBf16(d_wk), k.n, k.nh,
                            k.nkv, k.hs, kQkEps, stream_)
                  .ok());
  Sync();
  const std::vector<uint16_t> got = d_qkv.ToHost();
  EXPECT_LE(RelError(got, ToDoubles(ref)), kTolBf16);
  ExpectVUntouched(k, got, qkv);
  const std::vector<uint16_t> raw = d_raw.ToHost();
  for (int r = 0; r < k.n; ++r) {
    const size_t row = static_cast<size_t>(r) * k.heads() * k.hs;
    ASSERT_TRUE(std::equal(raw.begin() + row, raw.begin() + row + k.heads() * k.hs,
                           qkv.begin() + static_cast<size_t>(r) * k.width()))
        << "qk_raw row " << r;
  }

  DeviceBuffer<uint16_t> d_unkept(qkv);
  ASSERT_TRUE(QkNormForward(AsBf16(d_unkept), nullptr, AsBf16(d_wq), AsBf16(d_wk), k.n, k.nh, k.nkv,
                            k.hs, kQkEps, stream_)
                  .ok());
  Sync();
  EXPECT_EQ(d_unkept.ToHost(), got);
}

// dq, dk written over dy as the CPU op's within one bf16 rounding, dv bit-identical; the
// weights' gradients added onto their prefill as the CPU's, and bit for bit the same on a
// second run.
TEST_P(QkNormTest, BackwardMatchesTheCpuOpAndIsDeterministic) {
  const QkNormCase k = GetParam();
  std::mt19937 rng(12);
  const auto qkv = test_util::RandomBf16Bits(k.elems(), 1.0f, rng, 0.25f);
  const auto wq = test_util::RandomBf16Bits(k.hs, 0.3f, rng, 1.0f);
  const auto wk = test_util::RandomBf16Bits(k.hs, 0.3f, rng, 1.0f);
  const auto dy = test_util::RandomBf16Bits(k.elems(), 1.0f, rng);
  std::mt19937_64 rng64(13);
  const std::vector<float> dwq0 = test_util::Random(rng64, k.hs);
  const std::vector<float> dwk0 = test_util::Random(rng64, k.hs);

  std::vector<float> normed = ToFloats(qkv), raw_ref(k.raw_elems()), rrms(k.n * k.heads());
  const std::vector<float> wq_f = ToFloats(wq), wk_f = ToFloats(wk);
  cpu::QkNormForward(normed.data(), raw_ref.data(), rrms.data(), wq_f.data(), wk_f.data(), k.n,
                     k.nh, k.nkv, k.hs, kQkEps);
  std::vector<float> dx_ref = ToFloats(dy), dwq_ref = dwq0, dwk_ref = dwk0;
  cpu::QkNormBackward(dx_ref.data(), dwq_ref.data(), dwk_ref.data(), raw_ref.data(), rrms.data(),
                      wq_f.data(), wk_f.data(), k.n, k.nh, k.nkv, k.hs);

  DeviceBuffer<uint16_t> d_qkv(qkv), d_wq(wq), d_wk(wk);
  DeviceBuffer<uint16_t> d_raw(std::vector<uint16_t>(k.raw_elems(), kGarbageBits));
  ASSERT_TRUE(QkNormForward(AsBf16(d_qkv), AsBf16(d_raw), AsBf16(d_wq), AsBf16(d_wk), k.n, k.nh,
                            k.nkv, k.hs, kQkEps, stream_)
                  .ok());
  DeviceBuffer<float> d_scratch(
      std::vector<float>(QkNormBackwardScratchFloats(k.n, k.nh, k.nkv, k.hs), -7.0f));
  std::vector<uint16_t> dx_first;
  std::vector<float> dwq_first, dwk_first;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(testing::Message() << "run " << run);
    DeviceBuffer<uint16_t> d_dqkv(dy);
    DeviceBuffer<float> d_dwq(dwq0), d_dwk(dwk0);
    ASSERT_TRUE(QkNormBackward(AsBf16(d_dqkv), d_dwq.get(), d_dwk.get(), AsBf16(d_raw),
                               AsBf16(d_wq), AsBf16(d_wk), d_scratch.get(), k.n, k.nh, k.nkv, k.hs,
                               kQkEps, stream_)
                    .ok());
    Sync();
    const std::vector<uint16_t> dx = d_dqkv.ToHost();
    const std::vector<float> dwq = d_dwq.ToHost(), dwk = d_dwk.ToHost();
    if (run == 0) {
      EXPECT_LE(RelError(dx, ToDoubles(dx_ref)), kTolBf16);
      ExpectVUntouched(k, dx, dy);
      EXPECT_LE(RelError(dwq, ToDoubles(dwq_ref)), kTolGrad);
      EXPECT_LE(RelError(dwk, ToDoubles(dwk_ref)), kTolGrad);
      dx_first = dx;
      dwq_first = dwq;
      dwk_first = dwk;
    } else {
      EXPECT_EQ(dx, dx_first);
      EXPECT_EQ(dwq, dwq_first);
      EXPECT_EQ(dwk, dwk_first);
    }
  }
}

// Qwen3's head size 128 and 64 at 32/8 heads (Qwen3-8B and smaller) and 4/4, at row counts no
// block size divides; 1001 rows at 32/8 heads are several rounds of the backward's 528 blocks
// with the last partial. 72 (9 threads in a group of 16), 8 (a thread a head) and 256 (a warp)
// cover the other group sizes.
INSTANTIATE_TEST_SUITE_P(Shapes, QkNormTest,
                         ::testing::Values(QkNormCase{37, 32, 8, 128}, QkNormCase{37, 32, 8, 64},
                                           QkNormCase{1001, 32, 8, 128},
                                           QkNormCase{1001, 32, 8, 64}, QkNormCase{301, 4, 4, 128},
                                           QkNormCase{301, 4, 4, 64}, QkNormCase{3, 4, 4, 128},
                                           QkNormCase{53, 6, 2, 72}, QkNormCase{41, 3, 1, 8},
                                           QkNormCase{19, 2, 2, 256}),
                         [](const ::testing::TestParamInfo<QkNormCase>& info) {
                           const QkNormCase& k = info.param;
                           return "N" + std::to_string(k.n) + "NH" + std::to_string(k.nh) + "NKV" +
                                  std::to_string(k.nkv) + "HS" + std::to_string(k.hs);
                         });

// ---- SwiGLU ----

double Silu(double g) { return g / (1.0 + std::exp(-g)); }

TEST_F(LlamaOpsTest, SwiGluForwardMatchesReference) {
  const int n = 29, inter = 200;
  std::mt19937 rng(5);
  const auto gu = test_util::RandomBf16Bits(static_cast<size_t>(n) * 2 * inter, 2.0f, rng);
  std::vector<double> out(static_cast<size_t>(n) * inter);
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < inter; ++j) {
      out[r * inter + j] = Silu(Val(gu[r * 2 * inter + j])) * Val(gu[r * 2 * inter + inter + j]);
    }
  }
  DeviceBuffer<uint16_t> d_gu(gu);
  DeviceBuffer<uint16_t> d_out(std::vector<uint16_t>(out.size(), kGarbageBits));
  ASSERT_TRUE(SwiGluForward(AsBf16(d_out), AsBf16(d_gu), n, inter, stream_).ok());
  Sync();
  EXPECT_LE(RelError(d_out.ToHost(), out), kTolBf16);
}

TEST_F(LlamaOpsTest, SwiGluBackwardWritesTheReferenceGradientApartOrInPlace) {
  const int n = 29, inter = 200;
  std::mt19937 rng(6);
  const auto gu = test_util::RandomBf16Bits(static_cast<size_t>(n) * 2 * inter, 2.0f, rng);
  const auto dout = test_util::RandomBf16Bits(static_cast<size_t>(n) * inter, 1.0f, rng);
  std::vector<double> dgu(gu.size());
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < inter; ++j) {
      const double g = Val(gu[r * 2 * inter + j]), u = Val(gu[r * 2 * inter + inter + j]);
      const double d = Val(dout[r * inter + j]);
      const double sig = 1.0 / (1.0 + std::exp(-g));
      dgu[r * 2 * inter + j] = d * u * sig * (1.0 + g * (1.0 - sig));
      dgu[r * 2 * inter + inter + j] = d * Silu(g);
    }
  }
  DeviceBuffer<uint16_t> d_gu(gu), d_dout(dout);
  DeviceBuffer<uint16_t> d_dgu(std::vector<uint16_t>(gu.size(), kGarbageBits));
  ASSERT_TRUE(SwiGluBackward(AsBf16(d_dgu), AsBf16(d_dout), AsBf16(d_gu), n, inter, stream_).ok());
  Sync();
  const std::vector<uint16_t> apart = d_dgu.ToHost();
  EXPECT_LE(RelError(apart, dgu), kTolBf16);
  // In place over gate_up, as LlamaCuda's backward runs it: the same bits.
  ASSERT_TRUE(SwiGluBackward(AsBf16(d_gu), AsBf16(d_dout), AsBf16(d_gu), n, inter, stream_).ok());
  Sync();
  EXPECT_EQ(d_gu.ToHost(), apart);
}

// ---- embedding (no positions) ----

class EmbeddingTest : public LlamaOpsTest {
 protected:
  static constexpr int kB = 2, kT = 5, kC = 64, kVp = 16;
  // Repeated tokens: the backward's atomics add several rows into one.
  const std::vector<int32_t> tokens_ = {3, 1, 3, 15, 0, 7, 3, 1, 9, 9};
};

TEST_F(EmbeddingTest, ForwardCopiesTheTokensRows) {
  std::mt19937 rng(7);
  const auto wte = test_util::RandomBf16Bits(static_cast<size_t>(kVp) * kC, 1.0f, rng);
  DeviceBuffer<uint16_t> d_wte(wte);
  DeviceBuffer<int32_t> d_tokens(tokens_);
  DeviceBuffer<uint16_t> d_out(std::vector<uint16_t>(kB * kT * kC, kGarbageBits));
  ASSERT_TRUE(
      EmbeddingForward(AsBf16(d_out), d_tokens.get(), AsBf16(d_wte), kB, kT, kC, stream_).ok());
  Sync();
  const std::vector<uint16_t> out = d_out.ToHost();
  for (int r = 0; r < kB * kT; ++r) {
    for (int j = 0; j < kC; ++j) {
      ASSERT_EQ(out[r * kC + j], wte[tokens_[r] * kC + j]) << "row " << r << " channel " << j;
    }
  }
}

TEST_F(EmbeddingTest, BackwardAccumulatesRowsPerToken) {
  std::mt19937 rng(8);
  const auto dout = test_util::RandomBf16Bits(kB * kT * kC, 1.0f, rng);
  std::vector<float> dwte0(kVp * kC);
  for (size_t i = 0; i < dwte0.size(); ++i) dwte0[i] = 0.01f * static_cast<float>(i % 13);
  std::vector<double> dwte(dwte0.begin(), dwte0.end());
  for (int r = 0; r < kB * kT; ++r) {
    for (int j = 0; j < kC; ++j) dwte[tokens_[r] * kC + j] += Val(dout[r * kC + j]);
  }
  DeviceBuffer<uint16_t> d_dout(dout);
  DeviceBuffer<float> d_dwte(dwte0);
  auto plan = PlanEmbeddingGrad(tokens_.data(), kB * kT, kVp);
  ASSERT_TRUE(plan.ok()) << plan.status();
  DeviceBuffer<int32_t> d_plan(plan->data);
  DeviceBuffer<float> d_scratch(std::vector<float>(EmbeddingGradScratchFloats(kB * kT, kC)));
  ASSERT_TRUE(EmbeddingBackward(d_dwte.get(), AsBf16(d_dout), *plan, d_plan.get(),
                                d_scratch.get(), kB, kT, kC, stream_)
                  .ok());
  Sync();
  EXPECT_LE(RelError(d_dwte.ToHost(), dwte), kTolGrad);
}

// ---- argument checks (no GPU needed) ----

// The norms' backward scratch (no GPU needed): one partial row (C; LayerNorm 2C, with the
// bias) per row lane of the one-pass backward up to 8192 wide (a lane per row of 256 blocks of
// up to 512 threads, or of 128 wider blocks; at most N lanes), and per slab of rows of the
// column reduction wider (about 1024 blocks of 256 channels in all, at least 8 rows a slab).
TEST(LlamaOpsArgs, NormBackwardScratchIsAPartialRowPerLaneOrSlab) {
  // 4096 wide: rows of 512 threads, 256 lanes.
  EXPECT_EQ(RmsNormBackwardScratchFloats(8192, 4096), 256u * 4096);
  EXPECT_EQ(LayerNormBackwardScratchFloats(8192, 4096), 256u * 2 * 4096);
  // 8192 wide: rows of a whole 1024-thread block, 128 lanes.
  EXPECT_EQ(RmsNormBackwardScratchFloats(8192, 8192), 128u * 8192);
  // 768 wide: 5 rows of 96 threads a block, 1280 lanes.
  EXPECT_EQ(LayerNormBackwardScratchFloats(16384, 768), 1280u * 2 * 768);
  // Fewer rows than lanes: a lane a row.
  EXPECT_EQ(RmsNormBackwardScratchFloats(20, 264), 20u * 264);
  // Wider than one pass: 64 tiles, 16 slabs of 512 rows.
  EXPECT_EQ(RmsNormBackwardScratchFloats(8192, 16384), 16u * 16384);
  // Wider than 1024 tiles: one slab.
  EXPECT_EQ(RmsNormBackwardScratchFloats(100, 262152), 262152u);
  EXPECT_EQ(LayerNormBackwardScratchFloats(0, 64), 0u);
}

// The q/k norm's backward scratch: a partial row of 2 HS (q | k) per block, 528 blocks of 256
// threads (HS / 8 threads a head, in a power-of-two group) or as few as the heads need.
TEST(LlamaOpsArgs, QkNormBackwardScratchIsAPartialRowPerBlock) {
  EXPECT_EQ(QkNormBackwardScratchFloats(4096, 32, 8, 128), 528u * 256);
  EXPECT_EQ(QkNormBackwardScratchFloats(3, 4, 4, 128), 2u * 256);  // 24 heads, 16 a block
  EXPECT_EQ(QkNormBackwardScratchFloats(3, 4, 4, 64), 1u * 128);   // 32 a block
  EXPECT_EQ(QkNormBackwardScratchFloats(3, 4, 4, 72), 2u * 144);   // groups of 16: 16 a block
  EXPECT_EQ(QkNormBackwardScratchFloats(3, 4, 4, 264), 0u);
}

TEST(LlamaOpsArgs, RejectsBadArguments) {
  alignas(16) static uint16_t dummy[256];
  bf16* p = reinterpret_cast<bf16*>(dummy);
  float* f = reinterpret_cast<float*>(dummy);
  const auto code = [](const absl::Status& s) { return s.code(); };
  constexpr auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(RmsNormForward(p, f, p, p, 4, 12, 1e-5f, nullptr)), kBad);  // c % 8
  EXPECT_EQ(code(RmsNormForward(p, f, p, p, 4, 16, 0.0f, nullptr)), kBad);   // eps
  EXPECT_EQ(code(RmsNormForward(p, nullptr, p, p, 4, 16, 1e-5f, nullptr)), kBad);
  EXPECT_EQ(code(RmsNormBackward(p, f, p, p, p, f, nullptr, 4, 16, nullptr)), kBad);  // scratch
  EXPECT_EQ(code(RopeForward(p, nullptr, f, f, 1, 4, 2, 1, 24, nullptr)), kBad);  // hs % 16
  EXPECT_EQ(code(RopeBackward(p + 1, nullptr, f, f, 1, 4, 2, 1, 16, nullptr)), kBad);  // align
  EXPECT_EQ(code(RopeTables(f, f, nullptr, 4, 8, nullptr)), kBad);
  EXPECT_EQ(code(SwiGluForward(p, p, 4, 12, nullptr)), kBad);  // i % 8
  EXPECT_EQ(code(SwiGluBackward(p, nullptr, p, 4, 16, nullptr)), kBad);
  EXPECT_EQ(code(EmbeddingForward(p, nullptr, p, 1, 4, 16, nullptr)), kBad);
  EXPECT_EQ(code(EmbeddingBackward(f, p, EmbeddingGradPlan{4}, nullptr, f, 1, 4, 16, nullptr)),
            kBad);  // no plan on the device
  // The q/k norm: hs a positive multiple of 8 up to 256, named in the message.
  for (int hs : {0, 12, 264}) {
    const absl::Status forward = QkNormForward(p, p, p, p, 1, 2, 1, hs, 1e-6f, nullptr);
    EXPECT_EQ(forward.code(), kBad) << hs;
    EXPECT_NE(forward.message().find("hs"), std::string::npos) << forward.message();
    EXPECT_EQ(code(QkNormBackward(p, f, f, p, p, p, f, 1, 2, 1, hs, 1e-6f, nullptr)), kBad) << hs;
  }
  EXPECT_EQ(code(QkNormForward(p, p, p, p, 1, 2, 1, 16, 0.0f, nullptr)), kBad);       // eps
  EXPECT_EQ(code(QkNormForward(p, p + 1, p, p, 1, 2, 1, 16, 1e-6f, nullptr)), kBad);  // qk_raw
  EXPECT_EQ(code(QkNormForward(p, p, p, p, 1, 2, 0, 16, 1e-6f, nullptr)), kBad);      // nkv
  EXPECT_EQ(code(QkNormBackward(p, f, f, p, p, p, nullptr, 1, 2, 1, 16, 1e-6f, nullptr)),
            kBad);  // scratch
  EXPECT_EQ(code(QkNormBackward(p, f, f, nullptr, p, p, f, 1, 2, 1, 16, 1e-6f, nullptr)),
            kBad);  // qk_raw
}

}  // namespace
}  // namespace weft::engine::cuda
