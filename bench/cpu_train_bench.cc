// cpu_train_bench: training throughput of the CPU engine under ZeRO, ranks as threads of this
// process over real Gloo on loopback (one OpenBLAS thread per rank).
//
// The config is the demo's model (examples/fortunes-char.pb.txt): 4 layers, 128 wide, 4 heads,
// vocabulary 256, context 128, micro-batch 8 per rank. Each configuration runs warmup steps,
// then timed steps; ranks=1 is the baseline of the same run for the scaling figure.
//
//   BENCH cpu_train ranks=R stage=Z tokens_per_s=T ms_per_step=M exposed_comm_pct=C scaling_vs_1=S
#include <cstdio>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "common/job_spec.h"
#include "coordinator/memory_store.h"
#include "worker/comm/communicator.h"
#include "worker/engine/cpu/model.h"
#include "worker/zero/zero_cpu.h"

namespace {

weft::v1::JobSpec DemoSpec(int stage) {
  weft::v1::JobSpec spec;
  auto* m = spec.mutable_model();
  m->set_num_layers(4);
  m->set_hidden_size(128);
  m->set_num_heads(4);
  m->set_vocab_size(256);
  m->set_padded_vocab_size(256);
  m->set_context_length(128);
  auto* t = spec.mutable_training();
  t->set_total_steps(1000);
  t->set_micro_batch_size(8);
  t->set_sequence_length(128);
  t->set_grad_accum_steps(1);
  t->set_seed(1337);
  auto* o = spec.mutable_optimizer();
  o->set_learning_rate(3e-3);
  spec.mutable_lr_schedule()->set_kind(weft::v1::LrSchedule::COSINE);
  spec.mutable_lr_schedule()->set_min_lr_ratio(0.1);
  spec.set_zero_stage(stage);
  weft::ApplyJobSpecDefaults(&spec);  // AdamW betas, epsilon, decay 0.1, clip 1.0
  return spec;
}

struct Measured {
  double tokens_per_s = 0;
  double ms_per_step = 0;
  double exposed_pct = 0;
};

Measured Run(int ranks, int stage, int warmup, int steps) {
  weft::MemoryStore store;
  std::vector<Measured> per_rank(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = weft::comm::CreateGlooCommunicator(&store, rank, ranks, {});
      if (!comm.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, std::string(comm.status().message()).c_str());
        std::exit(1);
      }
      const weft::v1::JobSpec spec = DemoSpec(stage);
      auto engine = weft::zero::ZeroCpuEngine::Create(spec, comm->get());
      if (!engine.ok()) std::exit(1);
      auto batch = [rank](int64_t step, int micro, const weft::zero::MicroBatch& mb) {
        for (int i = 0; i < 8 * 128; ++i) {
          const uint32_t x = static_cast<uint32_t>(step * 31 + rank * 17 + i * 7 + micro);
          mb.inputs[i] = static_cast<int32_t>(x % 251);
          mb.targets[i] = static_cast<int32_t>((x + 1) % 251);
        }
      };
      double ms = 0, exposed = 0;
      for (int s = 0; s < warmup + steps; ++s) {
        auto r = (*engine)->TrainStep(s, batch);
        if (!r.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank, std::string(r.status().message()).c_str());
          std::exit(1);
        }
        if (s >= warmup) {
          ms += r->timings.step_ms;
          exposed += r->timings.exposed_comm_ms;
        }
      }
      if (!(*comm)->Barrier()->Wait().ok()) std::exit(1);  // no rank closes early
      per_rank[rank].ms_per_step = ms / steps;
      per_rank[rank].exposed_pct = 100.0 * exposed / ms;
    });
  }
  for (auto& t : threads) t.join();
  Measured m = per_rank[0];
  m.tokens_per_s = ranks * 8.0 * 128.0 / (m.ms_per_step / 1000.0);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int warmup = 2, steps = 10;
  std::vector<int> stages = {3, 0};
  CLI::App app{"cpu_train_bench: ZeRO training throughput on CPU, 1 and 2 ranks"};
  app.add_option("--warmup", warmup, "untimed steps");
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--stages", stages, "ZeRO stages to measure");
  CLI11_PARSE(app, argc, argv);
  weft::engine::cpu::SetBlasThreads(1);

  for (int stage : stages) {
    const Measured one = Run(1, stage, warmup, steps);
    const Measured two = Run(2, stage, warmup, steps);
    for (const auto& [ranks, m] : {std::pair{1, one}, std::pair{2, two}}) {
      std::printf("BENCH cpu_train ranks=%d stage=%d tokens_per_s=%.0f ms_per_step=%.1f "
                  "exposed_comm_pct=%.1f scaling_vs_1=%.2f\n",
                  ranks, stage, m.tokens_per_s, m.ms_per_step, m.exposed_pct,
                  m.tokens_per_s / one.tokens_per_s);
    }
  }
  return 0;
}
