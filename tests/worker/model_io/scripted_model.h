// A tiny Llama whose next token is scripted, for tests of sampling that must know what the
// model will say (where it stops, what it prints) without training one.
//
// Its blocks add nothing (attention and MLP output projections are zero), so the last position's
// hidden state is the embedding of the last token alone. Each scripted pair (from, to) gives
// `from` the embedding e_k (the k-th unit vector) and `to` an lm_head row 100 e_k: after
// `from`, the logit of `to` is about 100 x sqrt(hidden_size) against a few hundredths for any
// other id, so greedy sampling, and in practice any temperature near 1, emits `to`. Ids outside
// the script keep random parameters and give no promise.
#ifndef WEFT_TESTS_WORKER_MODEL_IO_SCRIPTED_MODEL_H_
#define WEFT_TESTS_WORKER_MODEL_IO_SCRIPTED_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/engine/model_arch.h"
#include "weft/v1/job.pb.h"

namespace weft::testing {

struct ScriptedModel {
  weft::v1::JobSpec spec;
  std::vector<std::vector<float>> units;
};

inline constexpr int kScriptedHiddenSize = 16;  // at most this many scripted pairs

// `next`: the (from, to) pairs, each `from` distinct; ids in [0, vocab).
inline ScriptedModel MakeScriptedModel(int vocab, int context,
                                       const std::vector<std::pair<int32_t, int32_t>>& next) {
  ScriptedModel model;
  weft::v1::ModelSpec* m = model.spec.mutable_model();
  m->set_architecture(weft::v1::LLAMA);
  m->set_num_layers(1);
  m->set_hidden_size(kScriptedHiddenSize);
  m->set_num_heads(4);
  m->set_num_kv_heads(2);
  m->set_intermediate_size(24);
  m->set_vocab_size(vocab);
  m->set_context_length(context);
  m->set_tie_word_embeddings(false);  // the input and output of an id are set apart
  auto arch = engine::MakeModelArch(*m);
  EXPECT_TRUE(arch.ok()) << arch.status();
  if (!arch.ok()) return model;
  EXPECT_LE(next.size(), static_cast<size_t>(kScriptedHiddenSize));
  model.units.resize((*arch)->NumUnits());
  for (int u = 0; u < (*arch)->NumUnits(); ++u) {
    std::vector<float>& unit = model.units[u];
    unit.resize((*arch)->UnitSize(u));
    (*arch)->InitUnit(u, /*seed=*/11, unit.data());
    for (const engine::TensorInfo& t : (*arch)->UnitTensors(u)) {
      // Blocks that add nothing to the residual stream.
      if (absl::EndsWith(t.name, ".attn_out") || absl::EndsWith(t.name, ".down")) {
        std::fill(unit.begin() + t.offset, unit.begin() + t.offset + t.size, 0.0f);
      }
    }
  }
  const auto tensor = [&](const char* name) -> float* {
    for (const engine::TensorInfo& t : (*arch)->UnitTensors(0)) {
      if (t.name == name) return model.units[0].data() + t.offset;
    }
    ADD_FAILURE() << "no tensor " << name;
    return nullptr;
  };
  float* embed = tensor("embed");
  float* lm_head = tensor("lm_head");
  if (embed == nullptr || lm_head == nullptr) return model;
  const int c = kScriptedHiddenSize;
  for (size_t k = 0; k < next.size(); ++k) {
    const auto [from, to] = next[k];
    float* in = embed + static_cast<size_t>(from) * c;
    std::fill(in, in + c, 0.0f);
    in[k] = 1.0f;
    lm_head[static_cast<size_t>(to) * c + k] = 100.0f;
  }
  return model;
}

}  // namespace weft::testing

#endif  // WEFT_TESTS_WORKER_MODEL_IO_SCRIPTED_MODEL_H_
