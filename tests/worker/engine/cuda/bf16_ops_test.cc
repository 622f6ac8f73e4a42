// The bf16 CUDA ops (worker/engine/cuda/ops.h) against the CPU fp32 ops
// (or, for the attention pieces and the bias gradient, a small host reference). Inputs are
// random and ROUNDED to bf16 first; the reference runs in fp32 (double for the host softmax)
// on exactly those values, so what remains is the kernels' bf16 rounding of their outputs
// and their fp32 summation order. Parameter-gradient buffers start at a non-zero value (the
// += contract); written (=) activation gradients start at garbage.
//
// Error metric per tensor: max_i |gpu_i - ref_i| / max_i |ref_i| (relative to the tensor's
// largest magnitude). Rounding to bf16 (8 significant bits, nearest) moves a value by at most
// 2^-8 of its magnitude, hence kBf16 = 2^-8 + 1e-5 (fp32 slack) for every bf16 output.
//  - encoder forward, dwpe, CastToBf16, params_bf16: exact (0): the same fp32
//    adds in the same order, then one rounding, as the reference rounded with RNE;
//  - attention split/merge heads: exact (permutations);
//  - CausalSoftmaxRecompute: exact against CausalSoftmaxForward's P (same formula);
//  - zeros outside the causal (or document-masked) columns and in vocabulary padding: exact;
//  - cross-entropy rows of ignored targets (< 0): exactly 0 (loss and the whole row), the other
//    rows bit for bit as without ignored rows;
//  - every bf16 output otherwise (LayerNorm out/dinp, GELU, softmax P and dscores, dlogits):
//    kBf16;
//  - fp32 statistics and reductions (LayerNorm mean/rstd/dweight/dbias, lse, losses, dbias,
//    dwte (atomics), sum of squares): 1e-5 (summation order only);
//  - AdamW params/m/v and the clip scale: 1e-6 (FMA contraction only).
// Skips (GTEST_SKIP) when no CUDA device is present: CI builds with nvcc but has no GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/engine/cuda/cuda_test_util.h"
#include "worker/engine/adamw.h"
#include "worker/engine/cpu/ops.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/matmul.h"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using test_util::DeviceBuffer;
using test_util::Filled;
using test_util::FromBf16Bits;
using test_util::kGarbageBits;
using test_util::Random;
using test_util::ToBf16Bits;

constexpr float kPrefill = 0.375f;             // fp32 gradient buffers start here (exact)
constexpr double kBf16 = 1.0 / 256 + 1e-5;     // bf16 output rounding + fp32 slack
constexpr double kFp32 = 1e-5;                 // fp32 results, different summation order

std::vector<uint16_t> ToBf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = ToBf16Bits(x[i]);
  return out;
}

std::vector<float> FromBf16(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = FromBf16Bits(x[i]);
  return out;
}

// x with every value rounded to the nearest bf16 (as a float).
std::vector<float> Rounded(const std::vector<float>& x) { return FromBf16(ToBf16(x)); }

// A device bf16 tensor, uploaded from / read back as floats.
class Bf16Buffer {
 public:
  explicit Bf16Buffer(const std::vector<float>& host) : buf_(ToBf16(host)) {}
  // n elements of garbage (for outputs that must be written, not accumulated).
  explicit Bf16Buffer(size_t n) : buf_(std::vector<uint16_t>(n, kGarbageBits)) {}

  bf16* get() { return reinterpret_cast<bf16*>(buf_.get()); }
  std::vector<float> ToHost() const { return FromBf16(buf_.ToHost()); }
  std::vector<uint16_t> Bits() const { return buf_.ToHost(); }

 private:
  DeviceBuffer<uint16_t> buf_;
};

// Random values already rounded to bf16, so host and device see the same inputs.
std::vector<float> RandomBf16(std::mt19937_64& rng, size_t n, float mean = 0.0f,
                              float stddev = 1.0f) {
  return Rounded(Random(rng, n, mean, stddev));
}

double RelError(const std::vector<float>& gpu, const std::vector<float>& ref) {
  EXPECT_EQ(gpu.size(), ref.size());
  double max_diff = 0.0;
  double max_abs = 0.0;
  for (size_t i = 0; i < std::min(gpu.size(), ref.size()); ++i) {
    const double diff = std::fabs(static_cast<double>(gpu[i]) - ref[i]);
    max_diff = std::isnan(diff) ? INFINITY : std::max(max_diff, diff);
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(ref[i])));
  }
  return max_diff / (max_abs > 0.0 ? max_abs : 1.0);
}

#define EXPECT_CLOSE(gpu, ref, tol) \
  EXPECT_LE(RelError((gpu), (ref)), (tol)) << #gpu " vs " #ref

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

class Bf16OpsTest : public test_util::CudaStreamTest {
 protected:
  Bf16OpsTest() : CudaStreamTest("bf16 CUDA ops") {}

  std::mt19937_64 rng_{4321};
};

TEST_F(Bf16OpsTest, Encoder) {
  // Small vocab so tokens repeat (several atomics per dwte element); C a multiple of 8 but not
  // of 32 lanes x 8; maxT > T.
  const int b = 3, t = 17, c = 72, vp = 13, max_t = 20;
  std::uniform_int_distribution<int32_t> tok(0, vp - 2);  // last row is "padding": never used
  std::vector<int32_t> tokens(b * t);
  for (int32_t& x : tokens) x = tok(rng_);
  const std::vector<float> wte = RandomBf16(rng_, vp * c), wpe = RandomBf16(rng_, max_t * c);
  const std::vector<float> dout = RandomBf16(rng_, b * t * c);
  std::vector<float> out(b * t * c), dwte(vp * c, kPrefill), dwpe(max_t * c, kPrefill);
  cpu::EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), nullptr, b, t, c);
  cpu::EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), nullptr, b, t, c);

  DeviceBuffer<int32_t> d_tokens(tokens);
  Bf16Buffer d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(b * t * c);
  DeviceBuffer<float> d_dwte(Filled(vp * c, kPrefill)), d_dwpe(Filled(max_t * c, kPrefill));
  auto plan = PlanEmbeddingGrad(tokens.data(), b * t, vp);
  ASSERT_TRUE(plan.ok()) << plan.status();
  DeviceBuffer<int32_t> d_plan(plan->data);
  DeviceBuffer<float> d_scratch(std::vector<float>(EmbeddingGradScratchFloats(b * t, c)));
  ASSERT_TRUE(EncoderForward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), b, t, c,
                             stream_).ok());
  ASSERT_TRUE(EncoderBackward(d_dwte.get(), d_dwpe.get(), d_dout.get(), *plan, d_plan.get(),
                              d_scratch.get(), b, t, c, stream_).ok());
  Sync();
  EXPECT_CLOSE(d_out.ToHost(), Rounded(out), 0.0);
  EXPECT_CLOSE(d_dwte.ToHost(), dwte, kFp32);
  EXPECT_CLOSE(d_dwpe.ToHost(), dwpe, 0.0);

  EXPECT_EQ(EncoderForward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), b, t, 12,
                           stream_).code(),
            kInvalid);  // c not a multiple of 8
  EXPECT_EQ(EncoderBackward(d_dwte.get(), nullptr, d_dout.get(), *plan, d_plan.get(),
                            d_scratch.get(), b, t, c, stream_).code(),
            kInvalid);
  // A plan of another batch's size is refused, not read out of bounds.
  EXPECT_EQ(EncoderBackward(d_dwte.get(), d_dwpe.get(), d_dout.get(), *plan, d_plan.get(),
                            d_scratch.get(), b, t - 1, c, stream_).code(),
            kInvalid);
}

// The plan groups positions by token in position order and cuts tokens of more than 32
// positions into segments whose slots a combine entry adds in order; the sizes stay within
// the bounds models allocate by, for the worst inputs too. Host code: runs without a GPU.
TEST(EmbeddingGradPlanTest, GroupsByTokenAndSplitsLongRuns) {
  // Token 2 at 70 positions (three segments: 32, 32, 6), token 0 at 2, token 4 at 1.
  std::vector<int32_t> tokens(73, 2);
  tokens[5] = 0, tokens[40] = 0, tokens[72] = 4;
  auto plan = PlanEmbeddingGrad(tokens.data(), 73, 6);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->segments, 5);
  EXPECT_EQ(plan->combines, 1);
  EXPECT_EQ(plan->slots, 3);
  const std::vector<int32_t>& d = plan->data;
  EXPECT_EQ(d[0], 5);   // token 0's positions first, in order
  EXPECT_EQ(d[1], 40);
  EXPECT_EQ(d[2], 0);   // then token 2's
  EXPECT_EQ(d[72], 72);  // token 4's last
  const int32_t* seg = d.data() + 73;
  EXPECT_EQ(std::vector<int32_t>(seg, seg + 4), (std::vector<int32_t>{0, 2, 0, -1}));
  EXPECT_EQ(std::vector<int32_t>(seg + 4, seg + 8), (std::vector<int32_t>{2, 34, 2, 0}));
  EXPECT_EQ(std::vector<int32_t>(seg + 12, seg + 16), (std::vector<int32_t>{66, 72, 2, 2}));
  EXPECT_EQ(std::vector<int32_t>(seg + 16, seg + 20), (std::vector<int32_t>{72, 73, 4, -1}));
  EXPECT_EQ(std::vector<int32_t>(seg + 20, seg + 23), (std::vector<int32_t>{2, 0, 3}));

  tokens[9] = 6;
  const auto refused = PlanEmbeddingGrad(tokens.data(), 73, 6);
  EXPECT_EQ(refused.status().code(), kInvalid);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("position 9"));

  // Worst cases for the bounds: one token everywhere, every position its own token, and
  // tokens of 33 positions (the most slots per position).
  const int n = 33 * 40;
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<int32_t> worst(n);
    for (int p = 0; p < n; ++p) worst[p] = kind == 0 ? 0 : kind == 1 ? p : p / 33;
    auto w = PlanEmbeddingGrad(worst.data(), n, n);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_LE(w->data.size(), EmbeddingGradPlanMaxInts(n)) << kind;
    EXPECT_LE(static_cast<size_t>(w->slots) * 8, EmbeddingGradScratchFloats(n, 8)) << kind;
  }
}

// dwte is the host's fp32 sums in the plan's order, bit for bit, run after run: split tokens
// (a token at every position, and a few frequent ones) and single ones.
TEST_F(Bf16OpsTest, EmbeddingBackwardAddsInThePlansOrderBitForBit) {
  const int b = 4, t = 96, c = 40, vp = 40, n = b * t;
  for (int spread : {1, 3, vp}) {
    SCOPED_TRACE(testing::Message() << "tokens drawn from " << spread);
    std::uniform_int_distribution<int32_t> tok(0, spread - 1);
    std::vector<int32_t> tokens(n);
    for (int32_t& x : tokens) x = tok(rng_);
    const std::vector<float> dout = RandomBf16(rng_, static_cast<size_t>(n) * c);
    const std::vector<float> dwte0 = RandomBf16(rng_, static_cast<size_t>(vp) * c);
    auto plan = PlanEmbeddingGrad(tokens.data(), n, vp);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // The host's sums in the plan's order.
    std::vector<float> want = dwte0;
    const int32_t* order = plan->data.data();
    const int32_t* segments = order + n;
    std::vector<float> slots(static_cast<size_t>(plan->slots) * c, 0.0f);
    for (int s = 0; s < plan->segments; ++s) {
      const int32_t* seg = segments + 4 * s;
      for (int j = 0; j < c; ++j) {
        float acc = seg[3] < 0 ? want[seg[2] * c + j] : 0.0f;
        for (int p = seg[0]; p < seg[1]; ++p) acc += dout[order[p] * c + j];
        (seg[3] < 0 ? want[seg[2] * c + j] : slots[seg[3] * c + j]) = acc;
      }
    }
    const int32_t* combines = segments + 4 * plan->segments;
    for (int k = 0; k < plan->combines; ++k) {
      const int32_t* e = combines + 3 * k;
      for (int j = 0; j < c; ++j) {
        float acc = want[e[0] * c + j];
        for (int s = e[1]; s < e[1] + e[2]; ++s) acc += slots[s * c + j];
        want[e[0] * c + j] = acc;
      }
    }
    if (spread < vp) {
      EXPECT_GT(plan->combines, 0);
    }
    Bf16Buffer d_dout(dout);
    DeviceBuffer<int32_t> d_plan(plan->data);
    DeviceBuffer<float> d_scratch(std::vector<float>(EmbeddingGradScratchFloats(n, c)));
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer<float> d_dwte(dwte0);
      ASSERT_TRUE(EmbeddingBackward(d_dwte.get(), d_dout.get(), *plan, d_plan.get(),
                                    d_scratch.get(), b, t, c, stream_)
                      .ok());
      Sync();
      const std::vector<float> got = d_dwte.ToHost();
      for (size_t i = 0; i < got.size(); ++i) {
        uint32_t gb, wb;
        std::memcpy(&gb, &got[i], 4);
        std::memcpy(&wb, &want[i], 4);
        ASSERT_EQ(gb, wb) << "run " << run << " element " << i;
      }
    }
  }
}

// LayerNorm at (n, c).
void CheckLayerNorm(std::mt19937_64& rng, cudaStream_t stream, int n, int c) {
  SCOPED_TRACE(testing::Message() << "n " << n << " c " << c);
  // Rows with a large mean (as on the residual stream) exercise the two-pass variance.
  const std::vector<float> inp = RandomBf16(rng, n * c, 3.0f, 2.0f);
  const std::vector<float> weight = RandomBf16(rng, c, 1.0f, 0.2f), bias = RandomBf16(rng, c);
  const std::vector<float> dout = RandomBf16(rng, n * c);
  std::vector<float> out(n * c), mean(n), rstd(n);
  std::vector<float> dinp(n * c, kPrefill), dweight(c, kPrefill), dbias(c, kPrefill);
  cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                        bias.data(), n, c);
  cpu::LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                         weight.data(), mean.data(), rstd.data(), n, c);

  Bf16Buffer d_inp(inp), d_weight(weight), d_bias(bias), d_dout(dout), d_out(n * c);
  DeviceBuffer<float> d_mean(Filled(n)), d_rstd(Filled(n));
  Bf16Buffer d_dinp(Filled(n * c, kPrefill));  // the residual stream's gradient: +=
  DeviceBuffer<float> d_dweight(Filled(c, kPrefill)), d_dbias(Filled(c, kPrefill));
  DeviceBuffer<float> d_scratch(Filled(LayerNormBackwardScratchFloats(n, c), NAN));
  ASSERT_TRUE(LayerNormForward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(),
                               d_weight.get(), d_bias.get(), n, c, stream).ok());
  // The backward reads the GPU's own mean/rstd, as the engine will.
  ASSERT_TRUE(LayerNormBackward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(),
                                d_inp.get(), d_weight.get(), d_mean.get(), d_rstd.get(),
                                d_scratch.get(), n, c, stream).ok());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_CLOSE(d_out.ToHost(), out, kBf16);
  // The CPU sums a row serially in fp32, the GPU in warp and block order: their difference grows
  // about as sqrt(C) (1.6e-5 seen at 16384 wide).
  const double stat_tol = kFp32 * std::max(1.0, std::sqrt(c / 1024.0));
  EXPECT_CLOSE(d_mean.ToHost(), mean, stat_tol);
  EXPECT_CLOSE(d_rstd.ToHost(), rstd, stat_tol);
  EXPECT_CLOSE(d_dinp.ToHost(), dinp, kBf16);
  EXPECT_CLOSE(d_dweight.ToHost(), dweight, kFp32);
  EXPECT_CLOSE(d_dbias.ToHost(), dbias, kFp32);

  // Deterministic: a second run from the same start gives the same bits.
  DeviceBuffer<float> d_dweight2(Filled(c, kPrefill)), d_dbias2(Filled(c, kPrefill));
  Bf16Buffer d_dinp2(Filled(n * c, kPrefill));
  ASSERT_TRUE(LayerNormBackward(d_dinp2.get(), d_dweight2.get(), d_dbias2.get(), d_dout.get(),
                                d_inp.get(), d_weight.get(), d_mean.get(), d_rstd.get(),
                                d_scratch.get(), n, c, stream).ok());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(d_dweight2.ToHost(), d_dweight.ToHost());
  EXPECT_EQ(d_dbias2.ToHost(), d_dbias.ToHost());
  EXPECT_EQ(d_dinp2.Bits(), d_dinp.Bits());
}

TEST_F(Bf16OpsTest, LayerNorm) {
  // The one-pass backward (up to 8192 wide): a lane a row, narrow rows sharing a block.
  CheckLayerNorm(rng_, stream_, 37, 200);
  CheckLayerNorm(rng_, stream_, 5, 1600);  // 7 warps a row, the last one partly idle
  CheckLayerNorm(rng_, stream_, 7, 4096);
  CheckLayerNorm(rng_, stream_, 3, 8192);  // a row per 1024-thread block
  // More rows than lanes: each lane takes several rounds, the last one ragged.
  CheckLayerNorm(rng_, stream_, 4103, 64);     // 4096 lanes, a second round of 7 rows
  CheckLayerNorm(rng_, stream_, 20000, 768);   // 1280 lanes, 5 to a block, 16 rounds
  CheckLayerNorm(rng_, stream_, 600, 8192);    // 128 lanes, 5 rounds
  // The two-kernel backward, wider: no width limit (nothing per row in shared memory), the
  // parameters' sums over one row slab and several.
  CheckLayerNorm(rng_, stream_, 2, 12288);
  CheckLayerNorm(rng_, stream_, 2, 16384);
  CheckLayerNorm(rng_, stream_, 300, 16384);
}

TEST_F(Bf16OpsTest, LayerNormRejectsBadArguments) {
  Bf16Buffer x(64);
  DeviceBuffer<float> stats(Filled(8));
  // Misaligned input: one element past a 16-byte boundary.
  EXPECT_EQ(LayerNormForward(x.get(), stats.get(), stats.get(), x.get() + 1, x.get(), x.get(), 4,
                             8, stream_).code(),
            kInvalid);
  EXPECT_EQ(LayerNormForward(x.get(), stats.get(), stats.get(), x.get(), x.get(), x.get(), 0, 8,
                             stream_).code(),
            kInvalid);
  EXPECT_EQ(LayerNormBackward(x.get(), stats.get(), stats.get(), x.get(), x.get(), x.get(),
                              stats.get(), stats.get(), nullptr, 4, 8, stream_).code(),
            kInvalid);  // no scratch
}

TEST_F(Bf16OpsTest, Gelu) {
  const int64_t n = 100003;  // a tail of n % 8 elements; wide range incl. exp overflow
  const std::vector<float> inp = RandomBf16(rng_, n, 0.0f, 4.0f), dout = RandomBf16(rng_, n);
  std::vector<float> out(n), dinp(n, 0.0f);
  cpu::GeluForward(out.data(), inp.data(), n);
  cpu::GeluBackward(dinp.data(), inp.data(), dout.data(), n);  // += onto 0: the = contract

  Bf16Buffer d_inp(inp), d_dout(dout), d_out(n), d_dinp(n);
  ASSERT_TRUE(GeluForward(d_out.get(), d_inp.get(), n, stream_).ok());
  ASSERT_TRUE(GeluBackwardOverwrite(d_dinp.get(), d_inp.get(), d_dout.get(), n, stream_).ok());
  Sync();
  EXPECT_CLOSE(d_out.ToHost(), out, kBf16);
  EXPECT_CLOSE(d_dinp.ToHost(), dinp, kBf16);
  // In place (dinp == dout), as the engine runs it.
  ASSERT_TRUE(GeluBackwardOverwrite(d_dout.get(), d_inp.get(), d_dout.get(), n, stream_).ok());
  Sync();
  EXPECT_EQ(d_dout.Bits(), d_dinp.Bits());

  EXPECT_EQ(GeluForward(d_out.get(), d_inp.get(), 0, stream_).code(), kInvalid);
  EXPECT_EQ(
      GeluBackwardOverwrite(d_dinp.get(), d_inp.get() + 1, d_dout.get(), n - 1, stream_).code(),
      kInvalid);
}

// The projection back into the residual stream (Blas::LinearForwardResidual): the product,
// bias and residual summed in fp32 and rounded once, with and without a bias, into another
// buffer and in place over the residual.
TEST_F(Bf16OpsTest, LinearForwardResidual) {
  absl::StatusOr<std::unique_ptr<Blas>> blas = Blas::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  const int n = 37, c = 64, oc = 96;
  const std::vector<float> inp = RandomBf16(rng_, n * c), weight = RandomBf16(rng_, oc * c);
  const std::vector<float> bias = RandomBf16(rng_, oc), residual = RandomBf16(rng_, n * oc);
  for (const bool with_bias : {true, false}) {
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(testing::Message() << "bias " << with_bias << " in place " << in_place);
      std::vector<float> ref(n * oc);
      for (int r = 0; r < n; ++r) {
        for (int o = 0; o < oc; ++o) {
          double sum = (with_bias ? bias[o] : 0.0) + residual[r * oc + o];
          for (int k = 0; k < c; ++k) {
            sum += static_cast<double>(inp[r * c + k]) * weight[o * c + k];
          }
          ref[r * oc + o] = static_cast<float>(sum);
        }
      }
      Bf16Buffer d_inp(inp), d_weight(weight), d_bias(bias), d_residual(residual), d_out(n * oc);
      bf16* out = in_place ? d_residual.get() : d_out.get();
      ASSERT_TRUE((*blas)->LinearForwardResidual(out, d_inp.get(), d_weight.get(),
                                                 with_bias ? d_bias.get() : nullptr,
                                                 d_residual.get(), n, c, oc, stream_).ok());
      Sync();
      EXPECT_CLOSE(in_place ? d_residual.ToHost() : d_out.ToHost(), ref, kBf16);
    }
  }
  Bf16Buffer x(64);
  const absl::Status null_residual =
      (*blas)->LinearForwardResidual(x.get(), x.get(), x.get(), nullptr, nullptr, 8, 8, 8, stream_);
  EXPECT_EQ(null_residual.code(), kInvalid);
  EXPECT_THAT(null_residual.message(), testing::HasSubstr("residual"));
}

TEST_F(Bf16OpsTest, BiasBackward) {
  // oc not a multiple of the 256-channel tile; n not a multiple of the 8 row lanes.
  for (const auto& [n, oc] : {std::pair{1001, 2312}, std::pair{3, 8}, std::pair{20000, 64}}) {
    SCOPED_TRACE(testing::Message() << "n " << n << " oc " << oc);
    const std::vector<float> dout = RandomBf16(rng_, static_cast<size_t>(n) * oc);
    // The CPU Linear backward's bias part (a 1-channel input; only dbias is checked).
    const int c = 1;
    const std::vector<float> inp = Filled(n * c), weight = Filled(oc * c);
    std::vector<float> dinp(n * c), dweight(oc * c), dbias(oc, kPrefill);
    cpu::MatmulBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                        weight.data(), n, c, oc);

    Bf16Buffer d_dout(dout);
    DeviceBuffer<float> d_dbias(Filled(oc, kPrefill));
    DeviceBuffer<float> d_scratch(Filled(BiasBackwardScratchFloats(n, oc), NAN));
    ASSERT_TRUE(BiasBackward(d_dbias.get(), d_dout.get(), d_scratch.get(), n, oc, stream_).ok());
    Sync();
    const std::vector<float> first = d_dbias.ToHost();
    EXPECT_CLOSE(first, dbias, kFp32);
    // Accumulates, and deterministically: a second call adds exactly the same sums.
    DeviceBuffer<float> d_dbias2(Filled(oc, kPrefill));
    ASSERT_TRUE(BiasBackward(d_dbias2.get(), d_dout.get(), d_scratch.get(), n, oc, stream_).ok());
    Sync();
    EXPECT_EQ(d_dbias2.ToHost(), first);
  }
  DeviceBuffer<float> f(Filled(16));
  Bf16Buffer x(16);
  EXPECT_EQ(BiasBackward(f.get(), x.get(), f.get(), 2, 4, stream_).code(), kInvalid);  // oc % 8
}

// Host permutation (B, T, C) row slice -> (B, NH, T, HS): element (b, t, col0 + h * hs + d).
std::vector<float> ToHeads(const std::vector<float>& rows, int row_width, int col0, int b, int t,
                           int c, int nh) {
  const int hs = c / nh;
  std::vector<float> heads(static_cast<size_t>(b) * t * c);
  for (int bi = 0; bi < b; ++bi) {
    for (int h = 0; h < nh; ++h) {
      for (int ti = 0; ti < t; ++ti) {
        for (int d = 0; d < hs; ++d) {
          heads[((static_cast<size_t>(bi) * nh + h) * t + ti) * hs + d] =
              rows[(static_cast<size_t>(bi) * t + ti) * row_width + col0 + h * hs + d];
        }
      }
    }
  }
  return heads;
}

TEST_F(Bf16OpsTest, AttentionHeadPermutations) {
  const int b = 2, t = 24, c = 48, nh = 3;  // HS = 16; T not a power of two
  const size_t btc = static_cast<size_t>(b) * t * c;
  const std::vector<float> qkv = RandomBf16(rng_, 3 * btc);
  Bf16Buffer d_qkv(qkv), d_q(btc), d_k(btc), d_v(btc);
  ASSERT_TRUE(AttentionSplitHeads(d_q.get(), d_k.get(), d_v.get(), d_qkv.get(), b, t, c, nh,
                                  stream_).ok());
  Sync();
  EXPECT_EQ(d_q.ToHost(), ToHeads(qkv, 3 * c, 0, b, t, c, nh));
  EXPECT_EQ(d_k.ToHost(), ToHeads(qkv, 3 * c, c, b, t, c, nh));
  EXPECT_EQ(d_v.ToHost(), ToHeads(qkv, 3 * c, 2 * c, b, t, c, nh));

  // The merges invert the splits.
  Bf16Buffer d_dqkv(3 * btc);
  ASSERT_TRUE(AttentionMergeGrads(d_dqkv.get(), d_q.get(), d_k.get(), d_v.get(), b, t, c, nh,
                                  stream_).ok());
  Sync();
  EXPECT_EQ(d_dqkv.ToHost(), qkv);

  const std::vector<float> dout = RandomBf16(rng_, btc);
  Bf16Buffer d_dout(dout), d_dy(btc), d_out(btc);
  ASSERT_TRUE(AttentionSplitGrad(d_dy.get(), d_dout.get(), b, t, c, nh, stream_).ok());
  Sync();
  EXPECT_EQ(d_dy.ToHost(), ToHeads(dout, c, 0, b, t, c, nh));
  ASSERT_TRUE(AttentionMergeHeads(d_out.get(), d_dy.get(), b, t, c, nh, stream_).ok());
  Sync();
  EXPECT_EQ(d_out.ToHost(), dout);

  EXPECT_EQ(AttentionSplitHeads(d_q.get(), d_k.get(), d_v.get(), d_qkv.get(), b, t, c, 5,
                                stream_).code(),
            kInvalid);  // c % nh != 0
  EXPECT_EQ(AttentionMergeHeads(d_out.get(), d_dy.get(), b, t, 24, 6, stream_).code(),
            kInvalid);  // head size 4, not a multiple of 8
}

// Host causal softmax (double) of scale * scores over each row's columns [start[r], r % T]:
// P with zeros elsewhere, and lse. start: the rows' first columns (0 without documents).
void HostCausalSoftmax(const std::vector<float>& scores, int64_t rows, int t, float scale,
                       const std::vector<int>& start, std::vector<float>* p,
                       std::vector<float>* lse) {
  p->assign(scores.size(), 0.0f);
  lse->assign(rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int pos = static_cast<int>(r % t);
    const float* s = scores.data() + r * t;
    double max_val = -INFINITY;
    for (int j = start[r]; j <= pos; ++j) max_val = std::max(max_val, double{scale} * s[j]);
    double sum = 0.0;
    for (int j = start[r]; j <= pos; ++j) sum += std::exp(double{scale} * s[j] - max_val);
    for (int j = start[r]; j <= pos; ++j) {
      (*p)[r * t + j] = static_cast<float>(std::exp(double{scale} * s[j] - max_val) / sum);
    }
    (*lse)[r] = static_cast<float>(max_val + std::log(sum));
  }
}

// Every element outside the row's columns [start[r], r % T] is exactly zero.
bool OutsideIsZero(const std::vector<float>& x, int64_t rows, int t,
                   const std::vector<int>& start) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = 0; j < t; ++j) {
      const bool visible = j >= start[r] && j <= static_cast<int>(r % t);
      if (!visible && x[r * t + j] != 0.0f) return false;
    }
  }
  return true;
}

TEST_F(Bf16OpsTest, CausalSoftmax) {
  // T = 24: not a power of two, fewer columns than a warp covers; T = 520: several vectors per
  // lane and a ragged last step. Each without and with document masking (doc_starts (B, T)
  // of documents of 1, 9, 30, 130, 3 ... tokens: starts on and off the 8-column vectors).
  struct Case {
    int b, nh, t;
    bool docs;
  };
  for (const Case& c : {Case{2, 3, 24, false}, Case{2, 1, 520, false}, Case{2, 3, 24, true},
                        Case{2, 2, 520, true}}) {
    const int64_t rows = static_cast<int64_t>(c.b) * c.nh * c.t;
    const int t = c.t;
    SCOPED_TRACE(testing::Message() << "rows " << rows << " t " << t << " docs " << c.docs);
    std::vector<int32_t> doc_starts(static_cast<size_t>(c.b) * t, 0);  // (B, T)
    if (c.docs) {
      const int lengths[] = {1, 9, 30, 130, 3, 64, 17};
      for (int b = 0; b < c.b; ++b) {
        for (int start = 0, i = 3 * b; start < t; ++i) {
          const int len = std::min(lengths[i % 7], t - start);
          std::fill_n(doc_starts.begin() + static_cast<size_t>(b) * t + start, len, start);
          start += len;
        }
      }
    }
    std::vector<int> start(rows);  // row r = (b * NH + h) * T + pos
    for (int64_t r = 0; r < rows; ++r) start[r] = doc_starts[(r / (c.nh * t)) * t + r % t];
    DeviceBuffer<int32_t> d_starts(doc_starts);
    const int32_t* starts = c.docs ? d_starts.get() : nullptr;
    const float scale = 0.125f;  // 1 / sqrt(64)
    // The whole (T, T) block holds scores, as after the full q.k GEMM; the masked part must be
    // zeroed, not read.
    const std::vector<float> scores = RandomBf16(rng_, rows * t, 0.0f, 16.0f);
    std::vector<float> p, lse;
    HostCausalSoftmax(scores, rows, t, scale, start, &p, &lse);

    Bf16Buffer d_att(scores);
    DeviceBuffer<float> d_lse(Filled(rows, NAN));
    ASSERT_TRUE(
        CausalSoftmaxForward(d_att.get(), d_lse.get(), starts, 0, rows, t, c.nh, scale, stream_)
            .ok());
    Sync();
    const std::vector<float> gpu_p = d_att.ToHost();
    EXPECT_CLOSE(gpu_p, p, kBf16);
    EXPECT_TRUE(OutsideIsZero(gpu_p, rows, t, start));
    EXPECT_CLOSE(d_lse.ToHost(), lse, kFp32);

    Bf16Buffer d_recomputed(scores);
    ASSERT_TRUE(CausalSoftmaxRecompute(d_recomputed.get(), d_lse.get(), starts, 0, rows, t, c.nh,
                                       scale, stream_)
                    .ok());
    Sync();
    EXPECT_EQ(d_recomputed.Bits(), d_att.Bits());

    // Backward from the GPU's P and a dP that is non-zero everywhere (a full GEMM's output).
    const std::vector<float> dp = RandomBf16(rng_, rows * t);
    std::vector<float> dscores(rows * t, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const int pos = static_cast<int>(r % t);
      double dot = 0.0;
      for (int j = start[r]; j <= pos; ++j) dot += double{gpu_p[r * t + j]} * dp[r * t + j];
      for (int j = start[r]; j <= pos; ++j) {
        dscores[r * t + j] =
            static_cast<float>(scale * gpu_p[r * t + j] * (double{dp[r * t + j]} - dot));
      }
    }
    Bf16Buffer d_datt(dp);
    ASSERT_TRUE(
        CausalSoftmaxBackward(d_datt.get(), d_att.get(), starts, 0, rows, t, c.nh, scale, stream_)
            .ok());
    Sync();
    const std::vector<float> gpu_dscores = d_datt.ToHost();
    EXPECT_CLOSE(gpu_dscores, dscores, kBf16);
    EXPECT_TRUE(OutsideIsZero(gpu_dscores, rows, t, start));
  }
  Bf16Buffer x(256);
  DeviceBuffer<float> lse(Filled(16));
  DeviceBuffer<int32_t> starts(std::vector<int32_t>(16, 0));
  EXPECT_EQ(CausalSoftmaxForward(x.get(), lse.get(), nullptr, 0, 16, 12, 1, 1.0f, stream_).code(),
            kInvalid);  // t % 8
  EXPECT_EQ(CausalSoftmaxRecompute(x.get(), nullptr, nullptr, 0, 16, 16, 1, 1.0f, stream_).code(),
            kInvalid);
  EXPECT_EQ(CausalSoftmaxBackward(x.get(), x.get(), nullptr, 0, 0, 16, 1, 1.0f, stream_).code(),
            kInvalid);
  // With doc_starts the rows are whole sequences of nh heads.
  EXPECT_EQ(
      CausalSoftmaxForward(x.get(), lse.get(), starts.get(), 0, 16, 8, 3, 1.0f, stream_).code(),
      kInvalid);
  EXPECT_EQ(
      CausalSoftmaxForward(x.get(), lse.get(), starts.get(), 0, 16, 8, 0, 1.0f, stream_).code(),
      kInvalid);
}

TEST_F(Bf16OpsTest, CrossEntropy) {
  // V not a multiple of 8 with padding columns; then GPT-2's vocabulary (many steps per thread).
  for (const auto& [n, v, vp] : {std::tuple{37, 1001, 1032}, std::tuple{5, 50257, 50304}}) {
    SCOPED_TRACE(testing::Message() << "n " << n << " v " << v << " vp " << vp);
    std::vector<float> logits = RandomBf16(rng_, static_cast<size_t>(n) * vp, 0.0f, 3.0f);
    std::uniform_int_distribution<int32_t> tok(0, v - 1);
    std::vector<int32_t> targets(n);
    for (int32_t& x : targets) x = tok(rng_);
    targets[0] = v - 1;  // the last real column
    const float loss_scale = 0.5f;
    const float grad_scale = loss_scale / n;

    Bf16Buffer d_logits(logits);  // padding columns hold random values: must not be read
    DeviceBuffer<float> d_losses(Filled(n, NAN));
    DeviceBuffer<int32_t> d_targets(targets);
    std::vector<float> losses(n);
    const double mean_loss = cpu::SoftmaxCrossEntropyForwardBackward(
        logits.data(), losses.data(), targets.data(), n, v, vp, loss_scale);
    ASSERT_TRUE(CrossEntropyForwardBackward(d_logits.get(), d_losses.get(), d_targets.get(), n,
                                            v, vp, grad_scale, stream_).ok());
    Sync();
    const std::vector<float> dlogits = d_logits.ToHost();
    EXPECT_CLOSE(dlogits, logits, kBf16);
    const std::vector<float> gpu_losses = d_losses.ToHost();
    EXPECT_CLOSE(gpu_losses, losses, kFp32);
    const double gpu_mean =
        std::accumulate(gpu_losses.begin(), gpu_losses.end(), 0.0) / gpu_losses.size();
    EXPECT_NEAR(gpu_mean, mean_loss, kFp32 * mean_loss);
    for (int i = 0; i < n; ++i) {
      for (int j = v; j < vp; ++j) ASSERT_EQ(dlogits[static_cast<size_t>(i) * vp + j], 0.0f);
    }
  }
  Bf16Buffer x(64);
  DeviceBuffer<float> f(Filled(4));
  DeviceBuffer<int32_t> targets(std::vector<int32_t>(4, 0));
  EXPECT_EQ(CrossEntropyForwardBackward(x.get(), f.get(), targets.get(), 4, 17, 16, 1.0f,
                                        stream_).code(),
            kInvalid);  // v > vp
  EXPECT_EQ(CrossEntropyForwardBackward(x.get(), f.get(), targets.get(), 4, 10, 12, 1.0f,
                                        stream_).code(),
            kInvalid);  // vp % 8
}

// Targets < 0 (Hugging Face's -100, and -1) are ignored: loss 0 and every one of the row's Vp
// columns 0, whatever its logits; the other rows as when no row is ignored, bit for bit (one
// block per row).
TEST_F(Bf16OpsTest, CrossEntropyIgnoresNegativeTargets) {
  const int n = 9, v = 1001, vp = 1032;
  const std::vector<float> logits = RandomBf16(rng_, static_cast<size_t>(n) * vp, 0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> tok(0, v - 1);
  std::vector<int32_t> targets(n);
  for (int32_t& x : targets) x = tok(rng_);
  std::vector<int32_t> ignoring = targets;
  const int ignored[] = {0, 3, 4, 8};
  ignoring[0] = -100;
  ignoring[3] = -1;
  ignoring[4] = -100;
  ignoring[8] = -7;
  const float grad_scale = 0.25f;
  const auto run = [&](const std::vector<int32_t>& t, std::vector<uint16_t>* dlogits,
                       std::vector<float>* losses) {
    Bf16Buffer d_logits(logits);
    DeviceBuffer<float> d_losses(Filled(n, NAN));
    DeviceBuffer<int32_t> d_targets(t);
    ASSERT_TRUE(CrossEntropyForwardBackward(d_logits.get(), d_losses.get(), d_targets.get(), n,
                                            v, vp, grad_scale, stream_)
                    .ok());
    Sync();
    *dlogits = d_logits.Bits();
    *losses = d_losses.ToHost();
  };
  std::vector<uint16_t> all_rows, some_rows;
  std::vector<float> all_losses, some_losses;
  ASSERT_NO_FATAL_FAILURE(run(targets, &all_rows, &all_losses));
  ASSERT_NO_FATAL_FAILURE(run(ignoring, &some_rows, &some_losses));
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(testing::Message() << "row " << i << " target " << ignoring[i]);
    const auto row = some_rows.begin() + static_cast<size_t>(i) * vp;
    if (std::find(std::begin(ignored), std::end(ignored), i) != std::end(ignored)) {
      EXPECT_EQ(some_losses[i], 0.0f);
      EXPECT_TRUE(std::all_of(row, row + vp, [](uint16_t x) { return x == 0; }));
    } else {
      EXPECT_EQ(some_losses[i], all_losses[i]);
      EXPECT_TRUE(std::equal(row, row + vp, all_rows.begin() + static_cast<size_t>(i) * vp));
    }
  }
}

TEST_F(Bf16OpsTest, AdamWRunsFollowTheCpuOp) {
  const size_t n = 50001;
  std::vector<float> params = Random(rng_, n), m = Random(rng_, n, 0.0f, 0.01f);
  std::vector<float> v = Random(rng_, n, 0.0f, 0.01f);
  for (float& x : v) x = x * x;  // second moments are non-negative
  const std::vector<float> grads = Random(rng_, n);
  // Two runs as the engine keeps them: [0, split) decays, [split, n) does not.
  const size_t split = 20011;
  std::vector<uint8_t> mask(n, 0);
  std::fill(mask.begin(), mask.begin() + split, 1);
  AdamWConfig config;
  config.lr = 3e-3f;
  config.weight_decay = 0.1f;
  const int64_t step = 7;
  const float grad_scale = 0.5f;

  DeviceBuffer<float> d_params(params), d_grads(grads), d_m(m), d_v(v);
  DeviceBuffer<float> d_scale(std::vector<float>{grad_scale});
  Bf16Buffer d_params_bf16(n);
  engine::AdamWUpdate(params.data(), grads.data(), m.data(), v.data(), mask.data(), n, config,
                      step, grad_scale);
  // The first run also writes the bf16 copy; the second does not (a null copy).
  ASSERT_TRUE(AdamWUpdate(d_params.get(), d_params_bf16.get(), d_grads.get(), d_m.get(),
                          d_v.get(), split, /*decay=*/true, config, step, d_scale.get(), stream_)
                  .ok());
  ASSERT_TRUE(AdamWUpdate(d_params.get() + split, nullptr, d_grads.get() + split,
                          d_m.get() + split, d_v.get() + split, n - split, /*decay=*/false,
                          config, step, d_scale.get(), stream_)
                  .ok());
  Sync();
  const std::vector<float> gpu_params = d_params.ToHost();
  EXPECT_CLOSE(gpu_params, params, 1e-6);
  EXPECT_CLOSE(d_m.ToHost(), m, 1e-6);
  EXPECT_CLOSE(d_v.ToHost(), v, 1e-6);
  const std::vector<float> copy = d_params_bf16.ToHost();
  const std::vector<float> rounded = Rounded(gpu_params);
  EXPECT_TRUE(std::equal(copy.begin(), copy.begin() + split, rounded.begin()));
  const std::vector<uint16_t> bits = d_params_bf16.Bits();
  EXPECT_TRUE(std::all_of(bits.begin() + split, bits.end(),
                          [](uint16_t b) { return b == kGarbageBits; }));

  // A skipped step (NaN scale) leaves params, m and v alone, and the copy still follows the
  // params: the engine's gathers send it in place of a cast.
  DeviceBuffer<float> d_nan(std::vector<float>{NAN});
  Bf16Buffer d_skipped_bf16(n);
  ASSERT_TRUE(AdamWUpdate(d_params.get(), d_skipped_bf16.get(), d_grads.get(), d_m.get(),
                          d_v.get(), n, /*decay=*/true, config, step + 1, d_nan.get(), stream_)
                  .ok());
  Sync();
  EXPECT_EQ(d_params.ToHost(), gpu_params);
  EXPECT_CLOSE(d_m.ToHost(), m, 1e-6);
  EXPECT_EQ(d_skipped_bf16.ToHost(), Rounded(gpu_params));

  EXPECT_EQ(AdamWUpdate(d_params.get(), nullptr, d_grads.get(), d_m.get(), d_v.get(), n, true,
                        config, step, nullptr, stream_).code(),
            kInvalid);
  EXPECT_EQ(AdamWUpdate(d_params.get(), nullptr, d_grads.get(), d_m.get(), d_v.get(), n, true,
                        config, 0, d_scale.get(), stream_).code(),
            kInvalid);
}

// The kernels move float4s between the 16-byte boundaries and single elements around them,
// and fall back to single elements when the arrays' alignments differ: every offset must give
// the CPU op's result.
TEST_F(Bf16OpsTest, AdamWAndCastTakeAnyAlignment) {
  const size_t n = 1031;
  AdamWConfig config;
  config.lr = 1e-3f;
  const int64_t step = 3;
  DeviceBuffer<float> d_scale(std::vector<float>{1.0f});
  // (params, grads, m, v) offsets in elements: aligned alike, or not.
  const std::vector<std::array<size_t, 4>> offsets = {
      {0, 0, 0, 0}, {1, 1, 1, 1}, {3, 3, 3, 3}, {0, 1, 2, 3}, {2, 2, 2, 0}};
  for (const auto& off : offsets) {
    std::vector<float> params = Random(rng_, n + 3), m = Random(rng_, n + 3, 0.0f, 0.01f);
    std::vector<float> v = Random(rng_, n + 3, 0.0f, 0.01f);
    for (float& x : v) x = x * x;
    const std::vector<float> grads = Random(rng_, n + 3);
    DeviceBuffer<float> d_params(params), d_grads(grads), d_m(m), d_v(v);
    std::vector<float> p(params.begin() + off[0], params.begin() + off[0] + n);
    std::vector<float> mm(m.begin() + off[2], m.begin() + off[2] + n);
    std::vector<float> vv(v.begin() + off[3], v.begin() + off[3] + n);
    const std::vector<uint8_t> mask(n, 1);
    engine::AdamWUpdate(p.data(), grads.data() + off[1], mm.data(), vv.data(), mask.data(), n,
                        config, step, 1.0f);
    ASSERT_TRUE(AdamWUpdate(d_params.get() + off[0], nullptr, d_grads.get() + off[1],
                            d_m.get() + off[2], d_v.get() + off[3], n, /*decay=*/true, config,
                            step, d_scale.get(), stream_)
                    .ok());
    Sync();
    const std::vector<float> gpu = d_params.ToHost();
    EXPECT_CLOSE(std::vector<float>(gpu.begin() + off[0], gpu.begin() + off[0] + n), p, 1e-6)
        << "offsets " << off[0] << " " << off[1] << " " << off[2] << " " << off[3];
    // Untouched around the range.
    for (size_t i = 0; i < off[0]; ++i) EXPECT_EQ(gpu[i], params[i]);
    for (size_t i = off[0] + n; i < n + 3; ++i) EXPECT_EQ(gpu[i], params[i]);
    const std::vector<float> gpu_m = d_m.ToHost();
    EXPECT_CLOSE(std::vector<float>(gpu_m.begin() + off[2], gpu_m.begin() + off[2] + n), mm,
                 1e-6);

    // The cast: out at every offset against in at off[0].
    Bf16Buffer d_cast(n + 4);
    const std::vector<uint16_t> before = d_cast.Bits();
    ASSERT_TRUE(CastToBf16(d_cast.get() + off[1], d_params.get() + off[0], n, stream_).ok());
    Sync();
    const std::vector<float> cast = d_cast.ToHost();
    const std::vector<float> want =
        Rounded(std::vector<float>(gpu.begin() + off[0], gpu.begin() + off[0] + n));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), cast.begin() + off[1]));
    const std::vector<uint16_t> after = d_cast.Bits();
    for (size_t i = 0; i < off[1]; ++i) EXPECT_EQ(after[i], before[i]);
    for (size_t i = off[1] + n; i < n + 4; ++i) EXPECT_EQ(after[i], before[i]);
  }
}

TEST_F(Bf16OpsTest, CastAndGradNorm) {
  const size_t n = 3 * 256 * 8 * 1024 + 5;  // more than the sum's block cap; a ragged end
  const std::vector<float> x = Random(rng_, n);
  DeviceBuffer<float> d_x(x);
  Bf16Buffer d_cast(n);
  ASSERT_TRUE(CastToBf16(d_cast.get(), d_x.get(), n, stream_).ok());

  const float prefill = 0.5f;
  DeviceBuffer<float> d_sumsq(std::vector<float>{prefill});
  DeviceBuffer<float> d_scratch(Filled(SumOfSquaresScratchFloats(n), NAN));
  ASSERT_TRUE(SumOfSquares(d_sumsq.get(), d_x.get(), n, d_scratch.get(), stream_).ok());
  Sync();
  EXPECT_EQ(d_cast.ToHost(), Rounded(x));
  double sumsq = prefill;
  for (const float xi : x) sumsq += double{xi} * xi;
  const float gpu_sumsq = d_sumsq.ToHost()[0];
  EXPECT_NEAR(gpu_sumsq, sumsq, kFp32 * sumsq);

  // Clip factor: clip / norm above the threshold, 1 below it and when clipping is off; with
  // some targets ignored (1000 of 4096 count) the norm and the factor are of the gradient
  // scaled by 4096 / 1000; with none counting the factor is 0.
  for (const float counted : {4096.0f, 1000.0f, 0.0f}) {
    const float m = counted == 0 ? 0.0f : 4096.0f / counted;
    const float norm = m * std::sqrt(gpu_sumsq);
    DeviceBuffer<float> d_stats(std::vector<float>{gpu_sumsq, 0.0f, counted});
    for (const float clip : {norm / 4, norm * 4, 0.0f}) {
      DeviceBuffer<float> d_grad_scale(std::vector<float>{NAN});
      ASSERT_TRUE(ClipScale(d_grad_scale.get(), d_stats.get(), 4096.0, clip, stream_).ok());
      Sync();
      const float expected = m * (clip > 0 && norm > clip ? clip / norm : 1.0f);
      EXPECT_NEAR(d_grad_scale.ToHost()[0], expected, 1e-6 * expected)
          << "clip " << clip << " counted " << counted;
    }
  }

  EXPECT_EQ(SumOfSquares(d_sumsq.get(), d_x.get(), n, nullptr, stream_).code(), kInvalid);
  EXPECT_EQ(CastToBf16(nullptr, d_x.get(), n, stream_).code(), kInvalid);
  EXPECT_EQ(ClipScale(nullptr, d_sumsq.get(), 1.0, 1.0f, stream_).code(), kInvalid);
}

}  // namespace
}  // namespace weft::engine::cuda
