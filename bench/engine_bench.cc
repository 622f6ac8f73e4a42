// engine_bench: wall time of one fp32 CPU training step (forward, backward, AdamW) of a
// GPT-2 (default) or Llama (--arch llama) shaped model, single process, no communication.
// Reports the median of --steps steps after --warmup untimed ones, at an activation
// checkpointing level (--activation-checkpointing none|selective|full).
//
//   BENCH engine_cpu_step layers=4 width=128 heads=4 seq=128 batch=8 vocab=256 threads=1
//         step_ms=.. forward_ms=.. backward_ms=.. optimizer_ms=.. tokens_per_s=.. ... arch=gpt2
//         activation_checkpointing=none
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "worker/engine/adamw.h"
#include "worker/engine/cpu/model.h"
#include "worker/engine/model_arch.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 4, width = 128, heads = 4, seq = 128, batch = 8, vocab = 256, threads = 1;
  int steps = 10, warmup = 2, kv_heads = 0, intermediate = 0;
  std::string arch_name = "gpt2";
  std::string checkpointing = "none";
  CLI::App app{"Times one fp32 CPU training step of a GPT-2 or Llama shaped model."};
  app.add_option("--arch", arch_name)->check(CLI::IsMember({"gpt2", "llama"}));
  app.add_option("--kv-heads", kv_heads, "llama: key/value heads (0: as many as heads)");
  app.add_option("--intermediate", intermediate, "llama: SwiGLU width (0: 8/3 width)");
  app.add_option("--layers", layers);
  app.add_option("--width", width);
  app.add_option("--heads", heads);
  app.add_option("--seq", seq);
  app.add_option("--batch", batch);
  app.add_option("--vocab", vocab);
  app.add_option("--threads", threads, "OpenBLAS threads");
  app.add_option("--activation-checkpointing", checkpointing)
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  CLI11_PARSE(app, argc, argv);

  using namespace weft::engine;
  weft::v1::ModelSpec spec;
  spec.set_num_layers(layers);
  spec.set_hidden_size(width);
  spec.set_num_heads(heads);
  spec.set_vocab_size(vocab);
  spec.set_context_length(seq);
  if (arch_name == "llama") {
    spec.set_architecture(weft::v1::LLAMA);
    spec.set_num_kv_heads(kv_heads > 0 ? kv_heads : heads);
    spec.set_intermediate_size(intermediate > 0 ? intermediate : width * 8 / 3);
  }
  auto made = MakeModelArch(spec);
  if (!made.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", std::string(made.status().message()).c_str());
    return 2;
  }
  const ModelArch& arch = **made;
  cpu::SetBlasThreads(threads);

  const int units = arch.NumUnits();
  std::vector<std::vector<float>> params(units), grads(units), m(units), v(units);
  std::vector<std::vector<uint8_t>> masks(units);
  for (int u = 0; u < units; ++u) {
    const size_t n = arch.UnitSize(u);
    params[u].resize(n);
    arch.InitUnit(u, 1234, params[u].data());
    grads[u].assign(n, 0.0f);
    m[u].assign(n, 0.0f);
    v[u].assign(n, 0.0f);
    masks[u].resize(n);
    arch.UnitDecayMask(u, masks[u].data());
  }
  std::vector<int32_t> tokens(static_cast<size_t>(batch) * seq);
  std::vector<int32_t> targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % vocab);
    targets[i] = static_cast<int32_t>((i * 104729 + 13) % vocab);
  }

  auto created = cpu::CreateCpuModel(arch, batch, seq,
                                     checkpointing == "full"        ? Checkpointing::kFull
                                     : checkpointing == "selective" ? Checkpointing::kSelective
                                                                    : Checkpointing::kNone);
  if (!created.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", created.status().ToString().c_str());
    return 1;
  }
  const std::unique_ptr<cpu::CpuModel> cpu_model = *std::move(created);
  cpu::CpuModel& model = *cpu_model;
  model.SetShape(batch, seq);
  AdamWConfig adamw{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  std::vector<double> step_ms, fwd_ms, bwd_ms, opt_ms;
  float loss = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    const Clock::time_point t0 = Clock::now();
    model.EncoderForward(params[0].data(), tokens.data());
    for (int l = 0; l < layers; ++l) model.BlockForward(l, params[1 + l].data());
    loss = model.ClassifierForward(params[0].data(), targets.data(), 1.0f);
    const Clock::time_point t1 = Clock::now();
    for (int u = 0; u < units; ++u) std::fill(grads[u].begin(), grads[u].end(), 0.0f);
    model.ClassifierBackward(params[0].data(), grads[0].data());
    for (int l = layers - 1; l >= 0; --l) {
      model.BlockBackward(l, params[1 + l].data(), grads[1 + l].data());
    }
    model.EncoderBackward(grads[0].data());
    const Clock::time_point t2 = Clock::now();
    for (int u = 0; u < units; ++u) {
      AdamWUpdate(params[u].data(), grads[u].data(), m[u].data(), v[u].data(), masks[u].data(),
                  params[u].size(), adamw, s + 1, 1.0f);
    }
    const Clock::time_point t3 = Clock::now();
    if (s < warmup) continue;
    step_ms.push_back(Ms(t0, t3));
    fwd_ms.push_back(Ms(t0, t1));
    bwd_ms.push_back(Ms(t1, t2));
    opt_ms.push_back(Ms(t2, t3));
  }
  const double step = Median(step_ms);
  std::printf(
      "BENCH engine_cpu_step layers=%d width=%d heads=%d seq=%d batch=%d vocab=%d threads=%d "
      "step_ms=%.2f forward_ms=%.2f backward_ms=%.2f optimizer_ms=%.2f tokens_per_s=%.0f "
      "loss=%.4f activation_mb=%.1f arch=%s activation_checkpointing=%s\n",
      layers, width, heads, seq, batch, vocab, threads, step, Median(fwd_ms), Median(bwd_ms),
      Median(opt_ms), batch * seq / (step / 1000.0), loss, model.ActivationBytes() / 1048576.0,
      arch.name().c_str(), checkpointing.c_str());
  return 0;
}
