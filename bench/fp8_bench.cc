// fp8_bench: FP8 training's cost at the Llama-8B block's shape (micro-batch 2, sequence 4096,
// width 4096, 32 / 8 heads, SwiGLU 14336 unless told otherwise), one GPU.
//
// By default it times each Linear layer of the Llama block (q/k/v, o, gate/up, down) forward,
// input gradient and weight gradient in bf16 and in FP8 (Blas::Fp8Linear: E4M3 inputs and
// weights, E5M2 output gradients, per-tensor current scaling), the FP8 side with and without
// its casts (fp8.h: each tensor's amax, then its cast and transpose: the input and weight
// once, straight and transposed, the output gradient likewise):
//
//   build/bin/fp8_bench [--batch 2 --seq 4096 ...]
//   BENCH fp8_linear layer=gate_up n=.. k=.. m=.. bf16_ms=.. fp8_gemm_ms=.. fp8_cast_ms=..
//     gemm_speedup=.. speedup=.. delayed_cast_ms=.. delayed_speedup=..
//   BENCH fp8_block n=.. bf16_ms=.. fp8_ms=.. speedup=..
//
// With --model it runs the Llama CUDA model itself (CudaModel: embedding, --model-layers
// blocks under full recomputation, the LM head and loss, and the backward; no optimizer, one
// GPU) with its Linear layers in bf16 and in FP8 (ArenaRequests::fp8_linears), same
// parameters and tokens, and prints each pass's time and loss:
//
//   build/bin/fp8_bench --model [--model-layers 4 --vocab 32000 ...]
//   BENCH fp8_model layers=.. width=.. bf16_ms=.. fp8_ms=.. speedup=.. bf16_loss=.. fp8_loss=..
//
// (each _ms the layer's forward + input gradient + weight gradient; speedup counts the casts;
// delayed_: the casts of delayed scaling, from a history's amax, each reducing its tensor's
// amax in the same pass instead of a pass before it.)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
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
#include "worker/engine/cuda/fp8.h"
#include "worker/engine/cuda/matmul.h"
#include "worker/engine/cuda/model.h"
#include "worker/engine/model_arch.h"

namespace {

namespace cuda = weft::engine::cuda;
using namespace weft::bench;  // NOLINT(build/namespaces): the benches' small helpers

// One Linear layer (input width k, output width m, n rows) in bf16 against FP8, as the header
// says; returns {bf16 ms, FP8 ms with casts}.
std::pair<double, double> TimeFp8Linear(Timer& timer, cuda::Blas& blas, const char* layer, int n,
                                        int k, int m, std::mt19937& rng) {
  cudaStream_t stream = timer.stream;
  using cuda::Fp8Format;
  bf16* x = RandomBf16(static_cast<size_t>(n) * k, 1.0f, rng);
  bf16* w = RandomBf16(static_cast<size_t>(m) * k, 0.02f, rng);
  bf16* dy = RandomBf16(static_cast<size_t>(n) * m, 0.01f, rng);
  bf16* out = Alloc<bf16>(static_cast<size_t>(n) * m);
  bf16* dx = Alloc<bf16>(static_cast<size_t>(n) * k);
  float* dw = ZeroFloats(static_cast<size_t>(m) * k);
  uint8_t* x8 = Alloc<uint8_t>(static_cast<size_t>(n) * k);
  uint8_t* x8_t = Alloc<uint8_t>(static_cast<size_t>(n) * k);
  uint8_t* w8 = Alloc<uint8_t>(static_cast<size_t>(m) * k);
  uint8_t* w8_t = Alloc<uint8_t>(static_cast<size_t>(m) * k);
  uint8_t* dy8 = Alloc<uint8_t>(static_cast<size_t>(n) * m);
  uint8_t* dy8_t = Alloc<uint8_t>(static_cast<size_t>(n) * m);
  // amax and scale_inv of x, w and dy, each 16-byte aligned (cuBLASLt's scale pointers)
  float* stats = ZeroFloats(3 * 8);
  const auto cast = [&](uint8_t* o, uint8_t* o_t, const bf16* src, int rows, int cols,
                        Fp8Format format, int slot) -> absl::Status {
    const absl::Status s =
        cuda::Fp8Amax(stats + 8 * slot, src, static_cast<int64_t>(rows) * cols, stream);
    if (!s.ok()) return s;
    return cuda::Fp8Cast(o, o_t, stats + 8 * slot + 4, src, stats + 8 * slot, rows, cols, format,
                         stream);
  };
  const double flops = 2.0 * n * k * m;
  const std::string name(layer);
  double bf16_ms = 0, gemm_ms = 0, cast_ms = 0;
  const auto time = [&](const std::string& op, double* sum, double op_flops,
                        const std::function<absl::Status()>& fn) {
    const double ms = timer.Time(fn, op.c_str());
    *sum += ms;
    if (op_flops > 0) {
      std::printf("BENCH cuda_op op=%s ms=%.3f tflops=%.1f\n", op.c_str(), ms, op_flops / ms / 1e9);
    } else {
      std::printf("BENCH cuda_op op=%s ms=%.3f\n", op.c_str(), ms);
    }
  };
  time(name + "_fwd", &bf16_ms, flops,
       [&] { return blas.LinearForward(out, x, w, nullptr, n, k, m, stream); });
  time(name + "_bwd_input", &bf16_ms, flops,
       [&] { return blas.LinearBackwardInput(dx, dy, w, n, k, m, stream); });
  time(name + "_bwd_weight", &bf16_ms, flops,
       [&] { return blas.LinearBackwardWeight(dw, dy, x, n, k, m, true, stream); });
  time(name + "_fp8_cast_x_w", &cast_ms, 0, [&]() -> absl::Status {
    const absl::Status s = cast(x8, x8_t, x, n, k, Fp8Format::kE4M3, 0);
    return s.ok() ? cast(w8, w8_t, w, m, k, Fp8Format::kE4M3, 1) : s;
  });
  time(name + "_fp8_cast_dy", &cast_ms, 0,
       [&] { return cast(dy8, dy8_t, dy, n, m, Fp8Format::kE5M2, 2); });
  // Delayed scaling's casts: no amax pass of their own (the cast reduces it for the history).
  double delayed_ms = 0;
  time(name + "_fp8_cast_delayed", &delayed_ms, 0, [&]() -> absl::Status {
    for (const auto& [o, o_t, src, rows, cols, format, slot] :
         {std::tuple{x8, x8_t, x, n, k, Fp8Format::kE4M3, 0},
          std::tuple{w8, w8_t, w, m, k, Fp8Format::kE4M3, 1},
          std::tuple{dy8, dy8_t, dy, n, m, Fp8Format::kE5M2, 2}}) {
      const absl::Status s = cuda::Fp8Cast(o, o_t, stats + 8 * slot + 4, src, stats + 8 * slot,
                                           rows, cols, format, stream, stats + 8 * slot + 2);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  const cuda::Fp8Operand a_x{x8, Fp8Format::kE4M3, stats + 4};
  const cuda::Fp8Operand b_w{w8, Fp8Format::kE4M3, stats + 12};
  const cuda::Fp8Operand a_dy{dy8, Fp8Format::kE5M2, stats + 20};
  const cuda::Fp8Operand b_w_t{w8_t, Fp8Format::kE4M3, stats + 12};
  const cuda::Fp8Operand a_dy_t{dy8_t, Fp8Format::kE5M2, stats + 20};
  const cuda::Fp8Operand b_x_t{x8_t, Fp8Format::kE4M3, stats + 4};
  time(name + "_fp8_fwd", &gemm_ms, flops,
       [&] { return blas.Fp8Linear(out, a_x, b_w, nullptr, nullptr, n, k, m, true, stream); });
  time(name + "_fp8_bwd_input", &gemm_ms, flops,
       [&] { return blas.Fp8Linear(dx, a_dy, b_w_t, nullptr, nullptr, n, m, k, false, stream); });
  time(name + "_fp8_bwd_weight", &gemm_ms, flops,
       [&] { return blas.Fp8LinearF32(dw, a_dy_t, b_x_t, m, n, k, true, stream); });
  std::printf(
      "BENCH fp8_linear layer=%s n=%d k=%d m=%d bf16_ms=%.3f fp8_gemm_ms=%.3f fp8_cast_ms=%.3f "
      "gemm_speedup=%.3f speedup=%.3f delayed_cast_ms=%.3f delayed_speedup=%.3f\n",
      layer, n, k, m, bf16_ms, gemm_ms, cast_ms, bf16_ms / gemm_ms, bf16_ms / (gemm_ms + cast_ms),
      delayed_ms, bf16_ms / (gemm_ms + delayed_ms));
  for (void* p :
       std::initializer_list<void*>{x, w, dy, out, dx, dw, x8, x8_t, w8, w8_t, dy8, dy8_t, stats}) {
    CheckCuda(cudaFree(p), "cudaFree");
  }
  return {bf16_ms, gemm_ms + cast_ms};
}

// The Llama model's pass (forward, loss, backward; full recomputation) with bf16 and then FP8
// Linear layers, as the header says.
void TimeFp8Model(Timer& timer, int layers, int b, int t, int c, int nh, int nkv, int inter,
                  int vocab, std::mt19937& rng) {
  cudaStream_t stream = timer.stream;
  weft::v1::ModelSpec spec;
  spec.set_architecture(weft::v1::LLAMA);
  spec.set_num_layers(layers);
  spec.set_hidden_size(c);
  spec.set_num_heads(nh);
  spec.set_num_kv_heads(nkv);
  spec.set_intermediate_size(inter);
  spec.set_vocab_size(vocab);
  spec.set_padded_vocab_size((vocab + 127) / 128 * 128);
  spec.set_context_length(t);
  spec.set_rope_theta(500000);
  spec.set_rms_norm_eps(1e-5);
  auto arch_or = weft::engine::MakeModelArch(spec);
  Check(arch_or.status(), "model arch");
  const weft::engine::ModelArch& arch = **arch_or;
  // Every parameter ~ U(-0.02, 0.02), the norms' weights too: enough for timing, and the loss
  // is only compared between the two precisions.
  std::vector<bf16*> params(arch.NumUnits());
  std::vector<float*> grads(arch.NumUnits());
  for (int u = 0; u < arch.NumUnits(); ++u) {
    params[u] = RandomBf16(arch.UnitSize(u), 0.02f, rng);
    grads[u] = ZeroFloats(arch.UnitSize(u));
  }
  std::vector<int32_t> tokens(static_cast<size_t>(b) * t), targets(tokens.size());
  std::uniform_int_distribution<int> token(0, vocab - 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = token(rng);
  for (size_t i = 0; i < tokens.size(); ++i) targets[i] = tokens[(i + 1) % tokens.size()];
  double ms[2] = {0, 0}, loss[2] = {0, 0};
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    weft::engine::cuda::ArenaRequests requests;
    requests.fp8_linears = fp8 == 1;
    auto model_or = weft::engine::cuda::CreateCudaModel(
        arch, b, t, weft::engine::Checkpointing::kFull, stream, requests);
    Check(model_or.status(), "model");
    weft::engine::cuda::CudaModel& model = **model_or;
    Check(model.SetBatch(b, t, tokens.data(), targets.data(), nullptr, false), "batch");
    const size_t split = arch.HeadOutputBegin();
    const auto pass = [&]() -> absl::Status {
      absl::Status s = model.EncoderForward(params[0]);
      for (int l = 0; s.ok() && l < layers; ++l) s = model.BlockForward(l, params[1 + l]);
      if (s.ok()) s = model.Classifier(params[0] + split, 1.0f / (b * t), grads[0] + split);
      for (int l = layers - 1; s.ok() && l >= 0; --l) {
        s = model.BlockBackward(l, params[1 + l], grads[1 + l],
                                weft::engine::cuda::GradWrite::kOverwrite);
      }
      if (s.ok()) s = model.EncoderBackward(grads[0]);
      return s;
    };
    ms[fp8] = timer.Time(pass, fp8 ? "fp8 model pass" : "bf16 model pass");
    std::vector<float> losses(tokens.size());
    CheckCuda(cudaMemcpy(losses.data(), model.Losses(), losses.size() * sizeof(float),
                         cudaMemcpyDeviceToHost),
              "losses");
    for (float x : losses) loss[fp8] += x / losses.size();
  }
  std::printf(
      "BENCH fp8_model layers=%d width=%d heads=%d kv_heads=%d intermediate=%d vocab=%d batch=%d "
      "seq=%d recompute=full bf16_ms=%.3f fp8_ms=%.3f speedup=%.3f bf16_loss=%.5f "
      "fp8_loss=%.5f\n",
      layers, c, nh, nkv, inter, vocab, b, t, ms[0], ms[1], ms[0] / ms[1], loss[0], loss[1]);
}

}  // namespace

int main(int argc, char** argv) {
  BlockOptions options;
  auto& [b, t, c, nh, nkv, inter, iters] = options;
  int model_layers = 4, vocab = 32000;
  bool model = false;
  CLI::App app{"Times the Llama block's Linear layers, or the Llama model, in bf16 and FP8."};
  AddBlockOptions(app, &options);
  app.add_flag("--model", model, "time the Llama model's pass with bf16 and FP8 Linear layers");
  app.add_option("--model-layers", model_layers, "--model: blocks");
  app.add_option("--vocab", vocab, "--model: vocabulary");
  CLI11_PARSE(app, argc, argv);
  const int hs = c / nh;
  const int qkv_w = (nh + 2 * nkv) * hs;
  const int n = b * t;

  std::mt19937 rng(1234);
  Timer timer = MakeTimer(iters);
  if (model) {
    TimeFp8Model(timer, model_layers, b, t, c, nh, nkv, inter, vocab, rng);
    return 0;
  }
  auto blas_or = cuda::Blas::Create();
  Check(blas_or.status(), "blas");
  double bf16_ms = 0, fp8_ms = 0;
  const std::pair<const char*, std::pair<int, int>> layers[] = {
      {"qkv", {c, qkv_w}}, {"out", {c, c}}, {"gate_up", {c, 2 * inter}}, {"down", {inter, c}}};
  for (const auto& [layer, km] : layers) {
    const auto [b_ms, f_ms] = TimeFp8Linear(timer, **blas_or, layer, n, km.first, km.second, rng);
    bf16_ms += b_ms;
    fp8_ms += f_ms;
  }
  std::printf(
      "BENCH fp8_block n=%d width=%d intermediate=%d bf16_ms=%.3f fp8_ms=%.3f speedup=%.3f\n", n, c,
      inter, bf16_ms, fp8_ms, bf16_ms / fp8_ms);
  return 0;
}
