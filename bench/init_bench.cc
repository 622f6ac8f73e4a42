// init_bench: wall time of one rank's initial state (InitialUnitState of every unit: the kept
// part of the parameters and of the decay mask), as ZeroCpuEngine and ZeroCudaEngine build it
// before their first step. The default shape is a 1.5B-parameter Llama (16 layers, width 2048,
// 32/8 heads, SwiGLU 8192, vocabulary 128256, untied head).
//
//   BENCH init_state params=1498482688 world=1 rank=0 stage=3 kept_floats=.. seconds=..
#include <chrono>
#include <cstdio>
#include <memory>

#include "CLI/CLI.hpp"
#include "worker/engine/model_arch.h"
#include "worker/zero/shard_layout.h"
#include "worker/zero/zero_engine.h"

int main(int argc, char** argv) {
  int layers = 16, width = 2048, heads = 32, kv_heads = 8, intermediate = 8192;
  int vocab = 128256, world = 1, rank = 0, stage = 3;
  CLI::App app{"Times one rank's initial state of a Llama-shaped model."};
  app.add_option("--layers", layers);
  app.add_option("--width", width);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv_heads);
  app.add_option("--intermediate", intermediate);
  app.add_option("--vocab", vocab);
  app.add_option("--world", world);
  app.add_option("--rank", rank);
  app.add_option("--stage", stage)->check(CLI::Range(0, 3));
  CLI11_PARSE(app, argc, argv);

  weft::v1::ModelSpec spec;
  spec.set_architecture(weft::v1::LLAMA);
  spec.set_num_layers(layers);
  spec.set_hidden_size(width);
  spec.set_num_heads(heads);
  spec.set_num_kv_heads(kv_heads);
  spec.set_intermediate_size(intermediate);
  spec.set_vocab_size(vocab);
  spec.set_context_length(2048);
  auto arch = weft::engine::MakeModelArch(spec);
  if (!arch.ok()) {
    std::fprintf(stderr, "%s\n", arch.status().ToString().c_str());
    return 1;
  }
  const weft::zero::ShardLayout layout(weft::zero::UnitSizes(**arch), world, rank);
  size_t kept = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int u = 0; u < layout.num_units(); ++u) {
    // Each unit is dropped at once: the bench measures time, not the memory of a whole rank.
    kept += weft::zero::InitialUnitState(**arch, layout, stage, 1234, u).kept.size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "BENCH init_state params=%zu world=%d rank=%d stage=%d kept_floats=%zu seconds=%.2f\n",
      (*arch)->ParameterCount(), world, rank, stage, kept, seconds);
  return 0;
}
