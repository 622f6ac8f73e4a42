// cuda_ops_bench: where a GPU training step of a Llama block goes, op by op, at a given shape
// (default: the Llama-8B shape at micro-batch 2, sequence 4096), or with --arch gpt2 of a GPT-2
// block (default: GPT 6.7B's, 4096 wide, 32 heads, micro-batch 8, sequence 1024). Each op runs
// --iters times after one untimed run, timed by CUDA events on one stream; the inputs are
// random bf16.
// (The Linear layers and the model in FP8 have a bench of their own: fp8_bench.cc.)
// Prints one line per op:
//
//   BENCH cuda_op op=gate_up_fwd ms=.. tflops=..    (GEMMs and attention: FLOPs / time)
//   BENCH cuda_op op=adamw ms=.. gbps=..            (memory-bound ops: bytes moved / time)
//
// then `BENCH cuda_ops ...` with the block's forward and backward (sum of its ops), so that a
// change to one kernel can be weighed against the whole step.
//
// With --docmask it times flash attention alone, forward + backward, with document masking
// (packed sequences: documents of pseudo-random lengths uniform in [--doc-min, --doc-max],
// default [150, 450], the last one cut at T) against full causal attention of the same shape
// in the same run, at the Llama-3.2-1B shape unless told otherwise (32 heads, 8 kv heads, head
// size 64, i.e. --width 2048; sequence 4096, micro-batch 1):
//
//   build/bin/cuda_ops_bench --docmask [--seq 4096 --batch 1 --iters 20]
//   BENCH attention_docmask t=4096 mean_doc=.. causal_ms=.. docmask_ms=.. speedup=..
//
// (speedup = causal_ms / docmask_ms, each forward + backward with the models' kernels, kAuto;
// where the Hopper kernels run, a second line attention_docmask_mma_sync times the mma.sync
// ones.)
//
// With --window W it times flash attention forward + backward with a sliding window of W keys
// (Mistral's: query t sees keys (t - W, t]) against full causal attention of the same shape
// in the same run, at Mistral-7B's attention unless told otherwise (32 heads, 8 kv heads, head
// size 128, i.e. --width 4096; sequence 16384, micro-batch 1):
//
//   build/bin/cuda_ops_bench --window 4096 [--seq 16384 --batch 1 --iters 20]
//   BENCH attention_window t=16384 window=4096 causal_ms=.. window_ms=.. ratio=.. ideal=..
//
// (ratio = window_ms / causal_ms, kAuto; ideal = the visible (query, key) pairs with the
// window over those without, what skipping every masked tile would give: 0.44 at T 16384,
// W 4096. Where the Hopper kernels run a second line attention_window_mma_sync times the
// mma.sync ones.)
//
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "bench/cuda_bench_util.h"
#include "worker/engine/adamw.h"
#include "worker/engine/cuda/matmul.h"
#include "worker/engine/cuda/ops.h"

namespace {

using weft::engine::cuda::bf16;
namespace cuda = weft::engine::cuda;
using namespace weft::bench;  // NOLINT(build/namespaces): the benches' small helpers

// Where attention_fwd ran the Hopper kernel, the mma.sync one too (outside the block's sums),
// so one call weighs the two.
void TimeMmaSyncForward(Timer& timer, double flops, bf16* y, float* lse, const bf16* qkv, int b,
                        int nh, int nkv, int t, int hs, cudaStream_t stream) {
  if (!cuda::FlashAttentionHopperForward(hs)) return;
  timer.Flops("attention_fwd_mma_sync", Timer::kNone, flops, [&] {
    return cuda::FlashAttentionForwardWith(cuda::FlashAttentionKernel::kMmaSync, y, lse, qkv,
                                           nullptr, 0, b, nh, nkv, t, hs, stream);
  });
}

// The same for the backward's dK/dV kernel ("attention_bwd_mma_sync").
void TimeMmaSyncBackward(Timer& timer, double flops, bf16* dqkv, const bf16* dy, const bf16* y,
                         const float* lse, const bf16* qkv, float* scratch, int b, int nh,
                         int nkv, int t, int hs, cudaStream_t stream) {
  if (!cuda::FlashAttentionHopperForward(hs)) return;
  timer.Flops("attention_bwd_mma_sync", Timer::kNone, flops, [&] {
    return cuda::FlashAttentionBackwardWith(cuda::FlashAttentionKernel::kMmaSync, dqkv, dy, y, lse,
                                            qkv, nullptr, 0, scratch, b, nh, nkv, t, hs, stream);
  });
}

// Documents of lengths uniform in [min_len, max_len] packed into b sequences of t tokens (the
// last one of each cut at t), from a fixed seed: doc_starts (B, T) as flash attention takes it.
// *docs counts them.
std::vector<int32_t> PackedDocStarts(int b, int t, int min_len, int max_len, int* docs) {
  std::mt19937 rng(20240601);
  std::uniform_int_distribution<int> len(min_len, max_len);
  std::vector<int32_t> starts(static_cast<size_t>(b) * t);
  *docs = 0;
  for (int bi = 0; bi < b; ++bi) {
    for (int start = 0; start < t; ++*docs) {
      const int end = std::min(t, start + len(rng));
      std::fill(starts.begin() + static_cast<size_t>(bi) * t + start,
                starts.begin() + static_cast<size_t>(bi) * t + end, start);
      start = end;
    }
  }
  return starts;
}

// Flash attention forward + backward of one shape with `kernel`, plain causal and then with a
// mask (doc_starts, DEVICE or nullptr, and window): prints each variant's op lines (`masked_op`
// names the masked one; FLOPs: the visible (query, key) pairs, 2 GEMMs of 2 HS each forward, 5
// backward) and returns {causal ms, masked ms}, each forward + backward.
std::pair<double, double> TimeMaskedAttention(Timer& timer, cuda::FlashAttentionKernel kernel,
                                              const char* masked_op, int b, int nh, int nkv, int t,
                                              int hs, const int32_t* doc_starts, int window,
                                              double causal_pairs, double masked_pairs,
                                              std::mt19937& rng) {
  cudaStream_t stream = timer.stream;
  const int qkv_w = (nh + 2 * nkv) * hs;
  const size_t n = static_cast<size_t>(b) * t;
  bf16* qkv = RandomBf16(n * qkv_w, 1.0f, rng);
  bf16* dy = RandomBf16(n * nh * hs, 1.0f, rng);
  bf16* y = Alloc<bf16>(n * nh * hs);
  bf16* dqkv = Alloc<bf16>(n * qkv_w);
  float* lse = ZeroFloats(static_cast<size_t>(b) * nh * t);
  float* scratch = ZeroFloats(cuda::FlashAttentionBackwardScratchFloats(b, nh, t, hs));
  const double pair_flops = 2.0 * 2.0 * nh * hs;  // forward: 2 GEMMs, 2 HS each per pair
  double ms[2] = {0, 0};
  for (int masked = 0; masked < 2; ++masked) {
    const int32_t* ds = masked ? doc_starts : nullptr;
    const int w = masked ? window : 0;
    const double pairs = masked ? masked_pairs : causal_pairs;
    const std::string op = std::string(masked ? masked_op : "attention_causal") +
                           (kernel == cuda::FlashAttentionKernel::kMmaSync ? "_mma_sync" : "");
    // The forward also leaves this variant's y and lse for its backward.
    const double fwd_ms = timer.Time(
        [&] {
          return cuda::FlashAttentionForwardWith(kernel, y, lse, qkv, ds, w, b, nh, nkv, t, hs,
                                                 stream);
        },
        "attention forward");
    const double bwd_ms = timer.Time(
        [&] {
          return cuda::FlashAttentionBackwardWith(kernel, dqkv, dy, y, lse, qkv, ds, w, scratch, b,
                                                  nh, nkv, t, hs, stream);
        },
        "attention backward");
    ms[masked] = fwd_ms + bwd_ms;
    std::printf("BENCH cuda_op op=%s_fwd ms=%.3f tflops=%.1f\n", op.c_str(), fwd_ms,
                pairs * pair_flops / fwd_ms / 1e9);
    std::printf("BENCH cuda_op op=%s_bwd ms=%.3f tflops=%.1f\n", op.c_str(), bwd_ms,
                2.5 * pairs * pair_flops / bwd_ms / 1e9);
  }
  return {ms[0], ms[1]};
}

// Document-masked attention (packed documents of [min_len, max_len] tokens) against full causal
// attention of the same shape; prints the BENCH `line`.
void TimeDocMaskAttention(Timer& timer, cuda::FlashAttentionKernel kernel, const char* line, int b,
                          int nh, int nkv, int t, int hs, int min_len, int max_len,
                          std::mt19937& rng) {
  const size_t n = static_cast<size_t>(b) * t;
  int docs = 0;
  const std::vector<int32_t> host_starts = PackedDocStarts(b, t, min_len, max_len, &docs);
  int32_t* starts = Alloc<int32_t>(n);
  CheckCuda(cudaMemcpy(starts, host_starts.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice),
            "copy");
  double causal_pairs = 0, doc_pairs = 0;
  for (size_t i = 0; i < n; ++i) {
    causal_pairs += static_cast<double>(i % t) + 1;
    doc_pairs += static_cast<double>(i % t) - host_starts[i] + 1;
  }
  const auto [causal_ms, doc_ms] =
      TimeMaskedAttention(timer, kernel, "attention_docmask", b, nh, nkv, t, hs, starts, 0,
                          causal_pairs, doc_pairs, rng);
  std::printf("BENCH %s t=%d mean_doc=%.1f causal_ms=%.3f docmask_ms=%.3f speedup=%.2f\n", line, t,
              static_cast<double>(n) / docs, causal_ms, doc_ms, causal_ms / doc_ms);
}

// A sliding window of `window` keys against full causal attention of the same shape; prints the
// BENCH `line` (ideal: the window's visible pairs over causal's).
void TimeWindowAttention(Timer& timer, cuda::FlashAttentionKernel kernel, const char* line, int b,
                         int nh, int nkv, int t, int hs, int window, std::mt19937& rng) {
  double causal_pairs = 0, window_pairs = 0;
  for (int i = 0; i < t; ++i) {
    causal_pairs += static_cast<double>(b) * (i + 1);
    window_pairs += static_cast<double>(b) * std::min(i + 1, window);
  }
  const auto [causal_ms, window_ms] =
      TimeMaskedAttention(timer, kernel, "attention_window", b, nh, nkv, t, hs, nullptr, window,
                          causal_pairs, window_pairs, rng);
  std::printf("BENCH %s t=%d window=%d causal_ms=%.3f window_ms=%.3f ratio=%.3f ideal=%.3f\n", line,
              t, window, causal_ms, window_ms, window_ms / causal_ms, window_pairs / causal_pairs);
}

}  // namespace

// One GPT-2 block, forward then backward, in GptCuda's order (engine/cuda/gpt2_model.cc):
// LayerNorm, qkv (+bias), flash attention, projection (+bias and the residual in the epilogue);
// LayerNorm, fc with GELU in the epilogue, projection (+residual); the backward's bias
// gradients and GELU-in-epilogue GEMM.
void TimeGptBlock(Timer& timer, cuda::Blas& blas, int b, int t, int c, int nh, std::mt19937& rng) {
  const int hs = c / nh;
  const int n = b * t;
  const size_t nc = static_cast<size_t>(n) * c;
  const size_t n4c = 4 * nc;
  cudaStream_t stream = timer.stream;
  bf16* w_qkv = RandomBf16(static_cast<size_t>(3) * c * c, 0.02f, rng);
  bf16* w_out = RandomBf16(static_cast<size_t>(c) * c, 0.02f, rng);
  bf16* w_fc = RandomBf16(static_cast<size_t>(4) * c * c, 0.02f, rng);
  bf16* w_proj = RandomBf16(static_cast<size_t>(4) * c * c, 0.02f, rng);
  bf16* bias = RandomBf16(static_cast<size_t>(4) * c, 0.02f, rng);
  bf16* ln_w = RandomBf16(c, 1.0f, rng);
  bf16* x = RandomBf16(nc, 1.0f, rng);
  bf16* xn = RandomBf16(nc, 1.0f, rng);
  bf16* qkv = RandomBf16(3 * nc, 1.0f, rng);
  bf16* y = Alloc<bf16>(nc);
  bf16* tmp = Alloc<bf16>(nc);
  bf16* dres = RandomBf16(nc, 0.01f, rng);
  bf16* fch = RandomBf16(n4c, 1.0f, rng);
  bf16* fcg = Alloc<bf16>(n4c);
  bf16* dbig4 = Alloc<bf16>(n4c);
  bf16* dqkv = Alloc<bf16>(3 * nc);
  float* mean = ZeroFloats(n);
  float* rstd = ZeroFloats(n);
  float* lse = ZeroFloats(static_cast<size_t>(b) * nh * t);
  float* dw = ZeroFloats(static_cast<size_t>(4) * c * c);
  float* db = ZeroFloats(static_cast<size_t>(4) * c);
  float* dln = ZeroFloats(2 * static_cast<size_t>(c));
  float* scratch = ZeroFloats(std::max(cuda::LayerNormBackwardScratchFloats(n, c),
                                       cuda::BiasBackwardScratchFloats(n, 4 * c)));
  float* flash_scratch = ZeroFloats(cuda::FlashAttentionBackwardScratchFloats(b, nh, t, hs));
  // LayerNorm's statistics must be sane for its backward: one forward fills them.
  Check(cuda::LayerNormForward(xn, mean, rstd, x, ln_w, bias, n, c, stream), "layernorm");

  const auto F = Timer::kForward;
  const auto B = Timer::kBackward;
  const double gemm = 2.0 * n * c;  // times the output width
  timer.Bytes("layernorm_fwd", F, 2.0 * nc * 2,
              [&] { return cuda::LayerNormForward(xn, mean, rstd, x, ln_w, bias, n, c, stream); });
  timer.Flops("qkv_fwd", F, gemm * 3 * c,
              [&] { return blas.LinearForward(qkv, xn, w_qkv, bias, n, c, 3 * c, stream); });
  const double attn_fwd = 2.0 * 2.0 * b * nh * static_cast<double>(t) * t * hs / 2;
  timer.Flops("attention_fwd", F, attn_fwd, [&] {
    return cuda::FlashAttentionForward(y, lse, qkv, nullptr, 0, b, nh, nh, t, hs, stream);
  });
  TimeMmaSyncForward(timer, attn_fwd, y, lse, qkv, b, nh, nh, t, hs, stream);
  timer.Flops("attn_out_residual_fwd", F, gemm * c, [&] {
    return blas.LinearForwardResidual(tmp, y, w_out, bias, x, n, c, c, stream);
  });
  timer.Bytes("layernorm_fwd", F, 2.0 * nc * 2,
              [&] { return cuda::LayerNormForward(xn, mean, rstd, x, ln_w, bias, n, c, stream); });
  timer.Flops("fc_gelu_fwd", F, gemm * 4 * c, [&] {
    return blas.LinearForwardGelu(fcg, fch, xn, w_fc, bias, n, c, 4 * c, stream);
  });
  timer.Flops("fcproj_residual_fwd", F, gemm * 4 * c, [&] {
    return blas.LinearForwardResidual(tmp, fcg, w_proj, bias, x, n, 4 * c, c, stream);
  });

  timer.Flops("fcproj_bwd_weight", B, gemm * 4 * c,
              [&] { return blas.LinearBackwardWeight(dw, dres, fcg, n, 4 * c, c, true, stream); });
  timer.Bytes("fcproj_bwd_bias", B, 2.0 * nc,
              [&] { return cuda::BiasBackward(db, dres, scratch, n, c, stream); });
  timer.Flops("fcproj_bwd_input_gelu", B, gemm * 4 * c, [&] {
    return blas.LinearBackwardInputGelu(dbig4, dres, w_proj, fch, n, 4 * c, c, stream);
  });
  timer.Flops("fc_bwd_weight", B, gemm * 4 * c,
              [&] { return blas.LinearBackwardWeight(dw, dbig4, xn, n, c, 4 * c, true, stream); });
  timer.Bytes("fc_bwd_bias", B, 2.0 * n4c,
              [&] { return cuda::BiasBackward(db, dbig4, scratch, n, 4 * c, stream); });
  timer.Flops("fc_bwd_input", B, gemm * 4 * c,
              [&] { return blas.LinearBackwardInput(tmp, dbig4, w_fc, n, c, 4 * c, stream); });
  timer.Bytes("layernorm_bwd", B, 4.0 * nc * 2, [&] {
    return cuda::LayerNormBackward(dres, dln, dln + c, tmp, x, ln_w, mean, rstd, scratch, n, c,
                                   stream);
  });
  timer.Flops("attn_out_bwd_weight", B, gemm * c,
              [&] { return blas.LinearBackwardWeight(dw, dres, y, n, c, c, true, stream); });
  timer.Bytes("attn_out_bwd_bias", B, 2.0 * nc,
              [&] { return cuda::BiasBackward(db, dres, scratch, n, c, stream); });
  timer.Flops("attn_out_bwd_input", B, gemm * c,
              [&] { return blas.LinearBackwardInput(tmp, dres, w_out, n, c, c, stream); });
  timer.Flops("attention_bwd", B, attn_fwd * 2.5, [&] {
    return cuda::FlashAttentionBackward(dqkv, tmp, y, lse, qkv, nullptr, 0, flash_scratch, b, nh,
                                        nh, t, hs, stream);
  });
  TimeMmaSyncBackward(timer, attn_fwd * 2.5, dqkv, tmp, y, lse, qkv, flash_scratch, b, nh, nh, t,
                      hs, stream);
  timer.Flops("qkv_bwd_weight", B, gemm * 3 * c,
              [&] { return blas.LinearBackwardWeight(dw, dqkv, xn, n, c, 3 * c, true, stream); });
  timer.Bytes("qkv_bwd_bias", B, 2.0 * 3 * nc,
              [&] { return cuda::BiasBackward(db, dqkv, scratch, n, 3 * c, stream); });
  timer.Flops("qkv_bwd_input", B, gemm * 3 * c,
              [&] { return blas.LinearBackwardInput(tmp, dqkv, w_qkv, n, c, 3 * c, stream); });
  timer.Bytes("layernorm_bwd", B, 4.0 * nc * 2, [&] {
    return cuda::LayerNormBackward(dres, dln, dln + c, tmp, x, ln_w, mean, rstd, scratch, n, c,
                                   stream);
  });
  const double block_params = 12.0 * c * c + 13.0 * c;
  const double block_flops = 6.0 * n * block_params + 3.5 * attn_fwd;
  std::printf(
      "BENCH cuda_ops arch=gpt2 batch=%d seq=%d width=%d heads=%d block_forward_ms=%.2f "
      "block_backward_ms=%.2f block_tflops=%.1f\n",
      b, t, c, nh, timer.block_forward_ms, timer.block_backward_ms,
      block_flops / (timer.block_forward_ms + timer.block_backward_ms) / 1e9);
}

int main(int argc, char** argv) {
  BlockOptions options;
  auto& [b, t, c, nh, nkv, inter, iters] = options;
  size_t optimizer_elems = size_t{256} << 20;
  std::string arch = "llama";
  CLI::App app{"Times the CUDA ops of one Llama (or GPT-2) block and the optimizer at one shape."};
  app.add_option("--arch", arch, "llama or gpt2")->check(CLI::IsMember({"llama", "gpt2"}));
  AddBlockOptions(app, &options);
  app.add_option("--optimizer-elems", optimizer_elems, "elements the AdamW and casts run over");
  bool docmask = false;
  int doc_min = 150, doc_max = 450;
  app.add_flag("--docmask", docmask,
               "time document-masked flash attention against full causal, then exit");
  app.add_option("--doc-min", doc_min, "--docmask: shortest document");
  app.add_option("--doc-max", doc_max, "--docmask: longest document");
  int window = 0;
  app.add_option("--window", window,
                 "time sliding-window flash attention (W keys) against full causal, then exit");
  CLI11_PARSE(app, argc, argv);
  if (window < 0) {
    std::fprintf(stderr, "cuda_ops_bench: --window: need W >= 1\n");
    return 1;
  }
  if (window > 0) {  // Mistral-7B's attention unless told otherwise
    if (app.count("--batch") == 0) b = 1;
    if (app.count("--seq") == 0) t = 16384;
  }
  if (docmask) {  // Llama-3.2-1B's attention unless told otherwise
    if (app.count("--batch") == 0) b = 1;
    if (app.count("--width") == 0) c = 2048;
    if (doc_min < 1 || doc_max < doc_min) {
      std::fprintf(stderr, "cuda_ops_bench: --doc-min/--doc-max: need 1 <= min <= max\n");
      return 1;
    }
  }
  if (arch == "gpt2") {  // GPT 6.7B's block unless told otherwise
    if (app.count("--batch") == 0) b = 8;
    if (app.count("--seq") == 0) t = 1024;
  }
  const int hs = c / nh;
  const int qkv_w = (nh + 2 * nkv) * hs;
  const int n = b * t;
  const size_t nc = static_cast<size_t>(n) * c;

  std::mt19937 rng(1234);
  auto blas_or = cuda::Blas::Create();
  Check(blas_or.status(), "blas");
  cuda::Blas& blas = **blas_or;
  Timer timer = MakeTimer(iters);
  cudaStream_t stream = timer.stream;

  if (window > 0) {
    TimeWindowAttention(timer, cuda::FlashAttentionKernel::kAuto, "attention_window", b, nh, nkv, t,
                        hs, window, rng);
    if (cuda::FlashAttentionHopperForward(hs)) {
      TimeWindowAttention(timer, cuda::FlashAttentionKernel::kMmaSync, "attention_window_mma_sync",
                          b, nh, nkv, t, hs, window, rng);
    }
    return 0;
  }
  if (docmask) {
    TimeDocMaskAttention(timer, cuda::FlashAttentionKernel::kAuto, "attention_docmask", b, nh,
                         nkv, t, hs, doc_min, doc_max, rng);
    if (cuda::FlashAttentionHopperForward(hs)) {
      TimeDocMaskAttention(timer, cuda::FlashAttentionKernel::kMmaSync,
                           "attention_docmask_mma_sync", b, nh, nkv, t, hs, doc_min, doc_max,
                           rng);
    }
    return 0;
  }
  if (arch == "gpt2") {
    TimeGptBlock(timer, blas, b, t, c, nh, rng);
  } else {
    // Weights (OC, C) and activations (N, *), as a block sees them.
    bf16* w_qkv = RandomBf16(static_cast<size_t>(qkv_w) * c, 0.02f, rng);
    bf16* w_out = RandomBf16(static_cast<size_t>(c) * c, 0.02f, rng);
    bf16* w_gate_up = RandomBf16(static_cast<size_t>(2) * inter * c, 0.02f, rng);
    bf16* w_down = RandomBf16(static_cast<size_t>(c) * inter, 0.02f, rng);
    bf16* norm_w = RandomBf16(c, 1.0f, rng);
    bf16* x = RandomBf16(nc, 1.0f, rng);
    bf16* xn = RandomBf16(nc, 1.0f, rng);
    bf16* qkv = RandomBf16(static_cast<size_t>(n) * qkv_w, 1.0f, rng);
    bf16* y = Alloc<bf16>(nc);
    bf16* tmp = Alloc<bf16>(nc);
    bf16* dres = RandomBf16(nc, 0.01f, rng);
    bf16* gate_up = RandomBf16(static_cast<size_t>(n) * 2 * inter, 1.0f, rng);
    bf16* act = Alloc<bf16>(static_cast<size_t>(n) * inter);
    bf16* dact = RandomBf16(static_cast<size_t>(n) * inter, 0.01f, rng);
    bf16* dgate_up = Alloc<bf16>(static_cast<size_t>(n) * 2 * inter);
    bf16* dqkv = Alloc<bf16>(static_cast<size_t>(n) * qkv_w);
    float* rstd = ZeroFloats(n);
    float* lse = ZeroFloats(static_cast<size_t>(b) * nh * t);
    float* dw_big = ZeroFloats(static_cast<size_t>(2) * inter * c);
    float* dw_norm = ZeroFloats(c);
    float* norm_scratch = ZeroFloats(cuda::RmsNormBackwardScratchFloats(n, c));
    float* flash_scratch = ZeroFloats(cuda::FlashAttentionBackwardScratchFloats(b, nh, t, hs));
    const int half = hs / 2;
    float* cos_t = ZeroFloats(static_cast<size_t>(t) * half);
    float* sin_t = ZeroFloats(static_cast<size_t>(t) * half);

    const auto F = Timer::kForward;
    const auto B = Timer::kBackward;
    const double gemm = 2.0 * n * c;  // times the output width
    // Forward, in the block's order.
    timer.Bytes("rmsnorm_fwd", F, 2.0 * nc * 2,
                [&] { return cuda::RmsNormForward(xn, rstd, x, norm_w, n, c, 1e-5f, stream); });
    timer.Flops("qkv_fwd", F, gemm * qkv_w,
                [&] { return blas.LinearForward(qkv, xn, w_qkv, nullptr, n, c, qkv_w, stream); });
    timer.Bytes("rope_fwd", F, 2.0 * n * (nh + nkv) * hs * 2,
                [&] {
                  return cuda::RopeForward(qkv, nullptr, cos_t, sin_t, b, t, nh, nkv, hs, stream);
                });
    // Causal: half the (T, T) products, 2 GEMMs of 2 T T HS each per head.
    const double attn_fwd = 2.0 * 2.0 * b * nh * static_cast<double>(t) * t * hs / 2;
    timer.Flops("attention_fwd", F, attn_fwd, [&] {
      return cuda::FlashAttentionForward(y, lse, qkv, nullptr, 0, b, nh, nkv, t, hs, stream);
    });
    TimeMmaSyncForward(timer, attn_fwd, y, lse, qkv, b, nh, nkv, t, hs, stream);
    timer.Flops("attn_out_residual_fwd", F, gemm * c, [&] {
      return blas.LinearForwardResidual(tmp, y, w_out, nullptr, x, n, c, c, stream);
    });
    timer.Bytes("rmsnorm_fwd", F, 2.0 * nc * 2,
                [&] { return cuda::RmsNormForward(xn, rstd, x, norm_w, n, c, 1e-5f, stream); });
    timer.Flops("gate_up_fwd", F, gemm * 2 * inter, [&] {
      return blas.LinearForward(gate_up, xn, w_gate_up, nullptr, n, c, 2 * inter, stream);
    });
    timer.Bytes("swiglu_fwd", F, 3.0 * n * inter * 2,
                [&] { return cuda::SwiGluForward(act, gate_up, n, inter, stream); });
    timer.Flops("down_residual_fwd", F, 2.0 * n * inter * c, [&] {
      return blas.LinearForwardResidual(tmp, act, w_down, nullptr, x, n, inter, c, stream);
    });

    // Backward, in the block's order (weight gradients fp32 +=).
    timer.Flops("down_bwd_weight", B, 2.0 * n * inter * c, [&] {
      return blas.LinearBackwardWeight(dw_big, dres, act, n, inter, c, true, stream);
    });
    timer.Flops("down_bwd_input", B, 2.0 * n * inter * c,
                [&] { return blas.LinearBackwardInput(dact, dres, w_down, n, inter, c, stream); });
    timer.Bytes("swiglu_bwd", B, 5.0 * n * inter * 2,
                [&] { return cuda::SwiGluBackward(dgate_up, dact, gate_up, n, inter, stream); });
    timer.Flops("gate_up_bwd_weight", B, gemm * 2 * inter, [&] {
      return blas.LinearBackwardWeight(dw_big, dgate_up, xn, n, c, 2 * inter, true, stream);
    });
    timer.Flops("gate_up_bwd_input", B, gemm * 2 * inter, [&] {
      return blas.LinearBackwardInput(tmp, dgate_up, w_gate_up, n, c, 2 * inter, stream);
    });
    timer.Bytes("rmsnorm_bwd", B, 4.0 * nc * 2, [&] {
      return cuda::RmsNormBackward(dres, dw_norm, tmp, x, norm_w, rstd, norm_scratch, n, c, stream);
    });
    timer.Flops("attn_out_bwd_weight", B, gemm * c,
                [&] { return blas.LinearBackwardWeight(dw_big, dres, y, n, c, c, true, stream); });
    timer.Flops("attn_out_bwd_input", B, gemm * c,
                [&] { return blas.LinearBackwardInput(tmp, dres, w_out, n, c, c, stream); });
    // Backward of attention: 5 (T, T) products where the forward has 2.
    timer.Flops("attention_bwd", B, attn_fwd * 2.5, [&] {
      return cuda::FlashAttentionBackward(dqkv, tmp, y, lse, qkv, nullptr, 0, flash_scratch, b, nh,
                                          nkv, t, hs, stream);
    });
    TimeMmaSyncBackward(timer, attn_fwd * 2.5, dqkv, tmp, y, lse, qkv, flash_scratch, b, nh, nkv,
                        t, hs, stream);
    timer.Bytes("rope_bwd", B, 2.0 * n * (nh + nkv) * hs * 2,
                [&] {
                  return cuda::RopeBackward(dqkv, nullptr, cos_t, sin_t, b, t, nh, nkv, hs, stream);
                });
    timer.Flops("qkv_bwd_weight", B, gemm * qkv_w, [&] {
      return blas.LinearBackwardWeight(dw_big, dqkv, xn, n, c, qkv_w, true, stream);
    });
    timer.Flops("qkv_bwd_input", B, gemm * qkv_w,
                [&] { return blas.LinearBackwardInput(tmp, dqkv, w_qkv, n, c, qkv_w, stream); });
    timer.Bytes("rmsnorm_bwd", B, 4.0 * nc * 2, [&] {
      return cuda::RmsNormBackward(dres, dw_norm, tmp, x, norm_w, rstd, norm_scratch, n, c, stream);
    });

    const double block_params = static_cast<double>(c) * (qkv_w + c + 3.0 * inter) + 2.0 * c;
    const double block_flops = 6.0 * n * block_params + 3.5 * attn_fwd;
    std::printf(
        "BENCH cuda_ops arch=llama batch=%d seq=%d width=%d heads=%d kv_heads=%d "
        "intermediate=%d "
        "block_forward_ms=%.2f block_backward_ms=%.2f block_tflops=%.1f\n",
        b, t, c, nh, nkv, inter, timer.block_forward_ms, timer.block_backward_ms,
        block_flops / (timer.block_forward_ms + timer.block_backward_ms) / 1e9);
  }

  // The optimizer's ops over optimizer_elems fp32 elements.
  const size_t m = optimizer_elems;
  float* p = ZeroFloats(m);
  float* g = ZeroFloats(m);
  float* mo = ZeroFloats(m);
  float* vo = ZeroFloats(m);
  bf16* p16 = Alloc<bf16>(m);
  float* scale = ZeroFloats(1);
  float* sumsq = ZeroFloats(1);
  float* sum_scratch = ZeroFloats(cuda::SumOfSquaresScratchFloats(m));
  const float one = 1.0f;
  CheckCuda(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice), "copy");
  weft::engine::AdamWConfig adamw;
  adamw.lr = 1e-4f;
  const auto N = Timer::kNone;
  timer.Bytes("adamw", N, 28.0 * m, [&] {
    return cuda::AdamWUpdate(p, nullptr, g, mo, vo, m, true, adamw, 10, scale, stream);
  });
  timer.Bytes("sum_of_squares", N, 4.0 * m,
              [&] { return cuda::SumOfSquares(sumsq, g, m, sum_scratch, stream); });
  timer.Bytes("cast_bf16", N, 6.0 * m, [&] { return cuda::CastToBf16(p16, p, m, stream); });
  timer.Bytes("memset_grads", N, 4.0 * m, [&] {
    return cudaMemsetAsync(g, 0, m * sizeof(float), stream) == cudaSuccess
               ? absl::OkStatus()
               : absl::InternalError("memset");
  });
  return 0;
}
