// docmask_step_bench: one GPU's training step (ZeroCudaEngine: forward, backward, AdamW) of a
// Llama shape on packed sequences, with document masking (block-diagonal attention, rotary
// positions restarted, the targets across boundaries ignored) against the same rows as one
// causal sequence each, in one process and one call, so the ratio is measured on one machine
// state. Documents have deterministic pseudo-random lengths uniform in [mean/2, 3*mean/2].
//
//   docmask_step_bench [--layers 16 --width 2048 --heads 32 --kv-heads 8 --intermediate 8192
//                       --vocab 128256 --seq 4096 --batch 1 --mean-doc 300 --steps 5]
//   BENCH docmask_step shape=llama_1b t=4096 batch=1 mean_doc=300 causal_step_ms=..
//         docmask_step_ms=.. speedup=.. causal_tokens_per_s=.. docmask_tokens_per_s=..
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/job_spec.h"
#include "coordinator/memory_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/zero/zero_cuda.h"

namespace {

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

struct Shape {
  int layers, width, heads, kv_heads, intermediate, vocab, seq, batch;
};

weft::v1::JobSpec SpecOf(const Shape& s, bool documents, int steps) {
  weft::v1::JobSpec spec;
  spec.set_name("docmask-bench");
  auto* m = spec.mutable_model();
  m->set_architecture(weft::v1::LLAMA);
  m->set_num_layers(s.layers);
  m->set_hidden_size(s.width);
  m->set_num_heads(s.heads);
  m->set_num_kv_heads(s.kv_heads);
  m->set_intermediate_size(s.intermediate);
  m->set_vocab_size(s.vocab);
  m->set_context_length(s.seq);
  m->set_tie_word_embeddings(false);
  auto* t = spec.mutable_training();
  t->set_total_steps(steps);
  t->set_micro_batch_size(s.batch);
  t->set_sequence_length(s.seq);
  t->set_grad_accum_steps(1);
  t->set_seed(1);
  spec.mutable_optimizer()->set_learning_rate(1e-4);
  spec.mutable_data()->set_document_masking(documents);
  spec.mutable_data()->set_reset_positions(documents);
  weft::ApplyJobSpecDefaults(&spec);
  return spec;
}

// Median step time (ms) of `steps` steps after 2 untimed ones.
double StepMs(const Shape& s, bool documents, int mean_doc, int steps) {
  const weft::v1::JobSpec spec = SpecOf(s, documents, steps + 2);
  weft::MemoryStore store;
  auto comm = weft::comm::CreateNcclCommunicator(&store, 0, 1, {});
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", std::string(comm.status().message()).c_str());
    std::exit(1);
  }
  auto engine = weft::zero::ZeroCudaEngine::Create(spec, comm->get());
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
    std::exit(1);
  }
  // Document lengths and tokens depend on the row only, so both runs read the same tokens.
  const weft::zero::BatchFn batch = [&](int64_t step, int, const weft::zero::MicroBatch& mb) {
    uint32_t x = 12345u + static_cast<uint32_t>(step);
    const auto next = [&x] { return x = x * 1664525u + 1013904223u; };
    for (int b = 0; b < s.batch; ++b) {
      int start = 0, left = 0;
      for (int t = 0; t < s.seq; ++t) {
        const size_t i = static_cast<size_t>(b) * s.seq + t;
        if (left == 0) {
          start = t;
          left = mean_doc / 2 + static_cast<int>(next() % static_cast<uint32_t>(mean_doc + 1));
        }
        --left;
        mb.inputs[i] = static_cast<int32_t>(next() % static_cast<uint32_t>(s.vocab));
        mb.targets[i] = static_cast<int32_t>(next() % static_cast<uint32_t>(s.vocab));
        if (mb.doc_starts != nullptr) {
          mb.doc_starts[i] = start;
          if (left == 0 && t + 1 < s.seq) mb.targets[i] = -1;  // across the boundary
        }
      }
    }
  };
  std::vector<double> ms;
  for (int step = 0; step < steps + 2; ++step) {
    auto r = (*engine)->TrainStep(step, batch);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
      std::exit(1);
    }
    if (step >= 2) ms.push_back(r->timings.step_ms);
  }
  return Median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  Shape s{16, 2048, 32, 8, 8192, 128256, 4096, 1};
  int mean_doc = 300, steps = 5;
  std::string name = "llama_1b";
  CLI::App app{"Times a GPU training step with document masking against full causal."};
  app.add_option("--layers", s.layers);
  app.add_option("--width", s.width);
  app.add_option("--heads", s.heads);
  app.add_option("--kv-heads", s.kv_heads);
  app.add_option("--intermediate", s.intermediate);
  app.add_option("--vocab", s.vocab);
  app.add_option("--seq", s.seq);
  app.add_option("--batch", s.batch);
  app.add_option("--mean-doc", mean_doc, "mean document length in tokens");
  app.add_option("--steps", steps, "timed steps (after 2 untimed)");
  app.add_option("--name", name, "shape name for the BENCH line");
  CLI11_PARSE(app, argc, argv);
  const double causal = StepMs(s, false, mean_doc, steps);
  const double docmask = StepMs(s, true, mean_doc, steps);
  const double tokens = static_cast<double>(s.batch) * s.seq;
  std::printf(
      "BENCH docmask_step shape=%s t=%d batch=%d mean_doc=%d causal_step_ms=%.2f "
      "docmask_step_ms=%.2f speedup=%.3f causal_tokens_per_s=%.0f docmask_tokens_per_s=%.0f\n",
      name.c_str(), s.seq, s.batch, mean_doc, causal, docmask, causal / docmask,
      tokens / (causal / 1000.0), tokens / (docmask / 1000.0));
  return 0;
}
