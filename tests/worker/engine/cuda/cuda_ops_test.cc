// Parity of the CUDA ops (worker/engine/cuda/ops.h) with the CPU ops in fp32: random inputs,
// both backends, outputs and gradients compared. Gradient buffers start at a non-zero value
// on both sides, so the accumulate (+=) contract is checked too.
//
// Error metric per tensor: max_i |gpu_i - cpu_i| / max(1, max_i |cpu_i|). Tolerances:
//  - encoder fwd/bwd, residual fwd/bwd: 0 (single IEEE adds in the same order: bit-identical);
//  - GELU fwd/bwd: 1e-6 (CUDA expf within 2 ulp of glibc's; FMA contraction on the GPU);
//  - LayerNorm fwd/bwd: 1e-5 (row sums in warp order instead of serial order);
//  - AdamW params/m/v: 1e-6 (FMA contraction only).
// Skips (GTEST_SKIP) when no CUDA device is present: CI builds with nvcc but has no GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/cuda/cuda_test_util.h"
#include "worker/engine/adamw.h"
#include "worker/engine/cpu/ops.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using test_util::DeviceBuffer;
using test_util::Filled;
using test_util::Random;

constexpr float kPrefill = 0.375f;  // gradient buffers start here (exact)

double RelError(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  EXPECT_EQ(gpu.size(), cpu.size());
  double max_diff = 0.0;
  double max_abs = 1.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(cpu[i])));
  }
  return max_diff / max_abs;
}

#define EXPECT_CLOSE(gpu, cpu, tol) \
  EXPECT_LE(RelError((gpu), (cpu)), (tol)) << #gpu " vs " #cpu

class CudaOpsTest : public test_util::CudaStreamTest {
 protected:
  CudaOpsTest() : CudaStreamTest("CUDA op parity") {}

  std::mt19937_64 rng_{1234};
};

TEST_F(CudaOpsTest, Encoder) {
  // Small vocab so tokens repeat (the dwte accumulation order matters); C not a multiple of
  // 32, maxT > T.
  const int b = 3, t = 17, c = 100, vp = 13, max_t = 20;
  std::uniform_int_distribution<int32_t> tok(0, vp - 2);  // last row is "padding": never used
  std::vector<int32_t> tokens(b * t);
  for (int32_t& x : tokens) x = tok(rng_);
  const std::vector<float> wte = Random(rng_, vp * c), wpe = Random(rng_, max_t * c);
  const std::vector<float> dout = Random(rng_, b * t * c);
  std::vector<float> out(b * t * c), dwte(vp * c, kPrefill), dwpe(max_t * c, kPrefill);
  cpu::EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
  cpu::EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), b, t, c);

  DeviceBuffer<int32_t> d_tokens(tokens);
  DeviceBuffer<float> d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(Filled(b * t * c));
  DeviceBuffer<float> d_dwte(Filled(vp * c, kPrefill));
  DeviceBuffer<float> d_dwpe(Filled(max_t * c, kPrefill));
  ASSERT_TRUE(EncoderForward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), b, t, c,
                             stream_).ok());
  ASSERT_TRUE(EncoderBackward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), b, t, c,
                              stream_).ok());
  Sync();
  EXPECT_CLOSE(d_out.ToHost(), out, 0.0);
  EXPECT_CLOSE(d_dwte.ToHost(), dwte, 0.0);
  EXPECT_CLOSE(d_dwpe.ToHost(), dwpe, 0.0);
}

TEST_F(CudaOpsTest, LayerNorm) {
  // Rows with a large mean (as on the residual stream) exercise the two-pass variance.
  const int n = 37, c = 200;
  const std::vector<float> inp = Random(rng_, n * c, 3.0f, 2.0f);
  const std::vector<float> weight = Random(rng_, c, 1.0f, 0.2f), bias = Random(rng_, c);
  const std::vector<float> dout = Random(rng_, n * c);
  std::vector<float> out(n * c), mean(n), rstd(n);
  std::vector<float> dinp(n * c, kPrefill), dweight(c, kPrefill), dbias(c, kPrefill);
  cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                        bias.data(), n, c);
  cpu::LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                         weight.data(), mean.data(), rstd.data(), n, c);

  DeviceBuffer<float> d_inp(inp), d_weight(weight), d_bias(bias), d_dout(dout);
  DeviceBuffer<float> d_out(Filled(n * c)), d_mean(Filled(n)),
      d_rstd(Filled(n));
  DeviceBuffer<float> d_dinp(Filled(n * c, kPrefill)),
      d_dweight(Filled(c, kPrefill)), d_dbias(Filled(c, kPrefill));
  ASSERT_TRUE(LayerNormForward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(),
                               d_weight.get(), d_bias.get(), n, c, stream_).ok());
  // The backward reads the GPU's own mean/rstd, as the engine will.
  ASSERT_TRUE(LayerNormBackward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(),
                                d_inp.get(), d_weight.get(), d_mean.get(), d_rstd.get(), n, c,
                                stream_).ok());
  Sync();
  EXPECT_CLOSE(d_out.ToHost(), out, 1e-5);
  EXPECT_CLOSE(d_mean.ToHost(), mean, 1e-5);
  EXPECT_CLOSE(d_rstd.ToHost(), rstd, 1e-5);
  EXPECT_CLOSE(d_dinp.ToHost(), dinp, 1e-5);
  EXPECT_CLOSE(d_dweight.ToHost(), dweight, 1e-5);
  EXPECT_CLOSE(d_dbias.ToHost(), dbias, 1e-5);
}

TEST_F(CudaOpsTest, Gelu) {
  const int64_t n = 100003;  // not a multiple of the block; wide range incl. exp overflow
  const std::vector<float> inp = Random(rng_, n, 0.0f, 4.0f), dout = Random(rng_, n);
  std::vector<float> out(n), dinp(n, kPrefill);
  cpu::GeluForward(out.data(), inp.data(), n);
  cpu::GeluBackward(dinp.data(), inp.data(), dout.data(), n);

  DeviceBuffer<float> d_inp(inp), d_dout(dout), d_out(Filled(n)),
      d_dinp(Filled(n, kPrefill));
  ASSERT_TRUE(GeluForward(d_out.get(), d_inp.get(), n, stream_).ok());
  ASSERT_TRUE(GeluBackward(d_dinp.get(), d_inp.get(), d_dout.get(), n, stream_).ok());
  Sync();
  EXPECT_CLOSE(d_out.ToHost(), out, 1e-6);
  EXPECT_CLOSE(d_dinp.ToHost(), dinp, 1e-6);
}

TEST_F(CudaOpsTest, Residual) {
  const int64_t n = 100003;
  const std::vector<float> a = Random(rng_, n), b = Random(rng_, n), dout = Random(rng_, n);
  std::vector<float> out(n), da(n, kPrefill), db(n, kPrefill);
  cpu::ResidualForward(out.data(), a.data(), b.data(), n);
  cpu::ResidualBackward(da.data(), db.data(), dout.data(), n);

  DeviceBuffer<float> d_a(a), d_b(b), d_dout(dout), d_out(Filled(n)),
      d_da(Filled(n, kPrefill)), d_db(Filled(n, kPrefill));
  ASSERT_TRUE(ResidualForward(d_out.get(), d_a.get(), d_b.get(), n, stream_).ok());
  ASSERT_TRUE(ResidualBackward(d_da.get(), d_db.get(), d_dout.get(), n, stream_).ok());
  Sync();
  EXPECT_CLOSE(d_out.ToHost(), out, 0.0);
  EXPECT_CLOSE(d_da.ToHost(), da, 0.0);
  EXPECT_CLOSE(d_db.ToHost(), db, 0.0);
}

TEST_F(CudaOpsTest, AdamW) {
  const size_t n = 50001;
  std::vector<float> params = Random(rng_, n), m = Random(rng_, n, 0.0f, 0.01f);
  std::vector<float> v = Random(rng_, n, 0.0f, 0.01f);
  for (float& x : v) x = x * x;  // second moments are non-negative
  const std::vector<float> grads = Random(rng_, n);
  std::vector<uint8_t> mask(n);
  for (size_t i = 0; i < n; ++i) mask[i] = static_cast<uint8_t>(i % 3);  // 0, 1 and 2 (!= 0)
  AdamWConfig config;
  config.lr = 3e-3f;
  const int64_t step = 7;
  const float grad_scale = 0.5f;

  DeviceBuffer<float> d_params(params), d_grads(grads), d_m(m), d_v(v);
  DeviceBuffer<uint8_t> d_mask(mask);
  engine::AdamWUpdate(params.data(), grads.data(), m.data(), v.data(), mask.data(), n, config,
                      step, grad_scale);
  ASSERT_TRUE(AdamWUpdate(d_params.get(), d_grads.get(), d_m.get(), d_v.get(), d_mask.get(), n,
                          config, step, grad_scale, stream_).ok());
  Sync();
  EXPECT_CLOSE(d_params.ToHost(), params, 1e-6);
  EXPECT_CLOSE(d_m.ToHost(), m, 1e-6);
  EXPECT_CLOSE(d_v.ToHost(), v, 1e-6);
}

TEST_F(CudaOpsTest, RejectsBadArguments) {
  // Typed null pointers: the ops are overloaded for float and bf16.
  float* const null = nullptr;
  EXPECT_EQ(GeluForward(null, null, -1, stream_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerNormForward(null, null, null, null, null, null, -1, 4, stream_).code(),
            absl::StatusCode::kInvalidArgument);
  // Empty work is a no-op, not an (invalid, zero-block) launch.
  EXPECT_TRUE(ResidualForward(null, null, null, 0, stream_).ok());
}

}  // namespace
}  // namespace weft::engine::cuda
