// Activation checkpointing on the CPU models (gpt2_model.h, llama_model.h): at kSelective and
// kFull, two accumulated micro-batches (the second smaller than the model's maximum in both B
// and T) give the losses and gradients of kNone bit for bit, for GPT-2 and Llama (tied and
// untied head), in float and in double; ActivationBytes falls by exactly what the headers'
// per-position formulas say; and the memory plan's count of it is the model's own.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/model_test_util.h"
#include "worker/engine/checkpointing.h"
#include "worker/engine/cpu/gpt2_model.h"
#include "worker/engine/cpu/llama_model.h"

namespace weft::engine {
namespace {

// Three layers: with two, only block 0's backward would read a stale shared buffer.
constexpr int kLayers = 3;
constexpr int kMaxB = 3;
constexpr int kMaxT = 7;
constexpr int kVocab = 11;
// (B, T) of the two micro-batches: the maximum, then one smaller in both dimensions, so the
// shared buffers (sized for the maximum) are also read at a packed smaller shape.
constexpr int kShapes[2][2] = {{kMaxB, kMaxT}, {2, 5}};

// C = 16, 4 heads (D = 4), V = 11 padded to 16.
GptConfig Gpt() {
  return GptConfig{.num_layers = kLayers, .hidden_size = 16, .num_heads = 4,
                   .vocab_size = kVocab, .padded_vocab_size = 16, .context_length = 8};
}

// C = 16, 4 query heads sharing 2 kv heads (D = 4, Q = 16, QKV = 32), SwiGLU 12.
LlamaConfig Llama(bool tied) {
  return LlamaConfig{.num_layers = kLayers, .hidden_size = 16, .num_heads = 4, .num_kv_heads = 2,
                     .intermediate_size = 12, .vocab_size = kVocab, .padded_vocab_size = 16,
                     .context_length = 8, .rope_theta = 100.0, .rms_norm_eps = 1e-5,
                     .tie_word_embeddings = tied};
}

template <typename T>
struct Run {
  std::vector<double> losses;         // per micro-batch
  std::vector<std::vector<T>> grads;  // accumulated over both
};

// Forward and backward of the two micro-batches on one model created at `level`, gradients
// accumulating as in a training step.
template <typename T, typename MakeModel>
Run<T> TwoMicroBatches(const ModelArch& arch, Checkpointing level, MakeModel make) {
  const std::vector<std::vector<T>> params = CastUnits<T>(RandomParams(arch, 5));
  const auto model = make(level);
  EXPECT_EQ(model->checkpointing(), level);
  Run<T> run;
  run.grads = ZerosLike(params);
  for (int m = 0; m < 2; ++m) {
    const int b = kShapes[m][0], t = kShapes[m][1];
    std::vector<int32_t> tokens(b * t), targets(b * t);
    for (int i = 0; i < b * t; ++i) {
      tokens[i] = (7 * i + 3 * m) % kVocab;
      targets[i] = (5 * i + m + 1) % kVocab;
    }
    model->SetShape(b, t);
    run.losses.push_back(ForwardBackward(*model, params, tokens, targets, T(0.5), &run.grads));
  }
  return run;
}

template <typename T, typename MakeModel>
void ExpectEveryLevelGivesTheBitsOfNone(const ModelArch& arch, MakeModel make) {
  const Run<T> none = TwoMicroBatches<T>(arch, Checkpointing::kNone, make);
  for (Checkpointing level : {Checkpointing::kSelective, Checkpointing::kFull}) {
    SCOPED_TRACE(CheckpointingName(level));
    const Run<T> run = TwoMicroBatches<T>(arch, level, make);
    EXPECT_EQ(run.losses, none.losses);
    ASSERT_EQ(run.grads.size(), none.grads.size());
    for (size_t u = 0; u < none.grads.size(); ++u) {
      ASSERT_EQ(run.grads[u].size(), none.grads[u].size());
      EXPECT_EQ(std::memcmp(run.grads[u].data(), none.grads[u].data(),
                            none.grads[u].size() * sizeof(T)),
                0)
          << "unit " << u << " gradient differs from kNone's";
    }
  }
}

TEST(CpuCheckpointingTest, GptEveryLevelGivesTheBitsOfNone) {
  const Gpt2Arch arch(Gpt());
  ExpectEveryLevelGivesTheBitsOfNone<float>(arch, [](Checkpointing level) {
    return std::make_unique<GptCpu>(Gpt(), kMaxB, kMaxT, level);
  });
  ExpectEveryLevelGivesTheBitsOfNone<double>(arch, [](Checkpointing level) {
    return std::make_unique<cpu::GptModel<double>>(Gpt(), kMaxB, kMaxT, level);
  });
}

TEST(CpuCheckpointingTest, LlamaEveryLevelGivesTheBitsOfNone) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied head" : "untied head");
    const LlamaArch arch(Llama(tied));
    ExpectEveryLevelGivesTheBitsOfNone<float>(arch, [tied](Checkpointing level) {
      return std::make_unique<LlamaCpu>(Llama(tied), kMaxB, kMaxT, level);
    });
    ExpectEveryLevelGivesTheBitsOfNone<double>(arch, [tied](Checkpointing level) {
      return std::make_unique<cpu::LlamaModel<double>>(Llama(tied), kMaxB, kMaxT, level);
    });
  }
}

// The saving of each level against kNone, in elements per position of (max_B, max_T): the
// formulas of gpt2_model.h and llama_model.h, with the (L - 1) layers that no longer keep
// their own copy.
struct Savings {
  size_t selective;
  size_t full;
};

template <typename MakeModel>
void ExpectSavings(MakeModel make, Savings per_position) {
  const size_t none = make(Checkpointing::kNone)->ActivationBytes();
  const size_t selective = make(Checkpointing::kSelective)->ActivationBytes();
  const size_t full = make(Checkpointing::kFull)->ActivationBytes();
  EXPECT_GT(none, selective);
  EXPECT_GT(selective, full);
  const size_t scale = (kLayers - 1) * static_cast<size_t>(kMaxB) * kMaxT * sizeof(float);
  EXPECT_EQ(none - selective, scale * per_position.selective);
  EXPECT_EQ(none - full, scale * per_position.full);
}

TEST(CpuCheckpointingTest, GptActivationBytesFallAsTheHeaderSays) {
  const size_t c = 16, nh = 4;
  ExpectSavings(
      [](Checkpointing level) { return std::make_unique<GptCpu>(Gpt(), kMaxB, kMaxT, level); },
      {.selective = 7 * c + nh * kMaxT, .full = 15 * c + 4 + nh * kMaxT});
}

TEST(CpuCheckpointingTest, LlamaActivationBytesFallAsTheHeaderSays) {
  const size_t c = 16, nh = 4, q = 16, qkv = 32, inter = 12;
  for (bool tied : {false, true}) {
    ExpectSavings(
        [tied](Checkpointing level) {
          return std::make_unique<LlamaCpu>(Llama(tied), kMaxB, kMaxT, level);
        },
        {.selective = 2 * c + q + inter + nh * kMaxT,
         .full = 3 * c + qkv + q + 3 * inter + 2 + nh * kMaxT});
  }
}

// The memory plan's count (the model's own buffer list, run without allocating) is what the
// built model holds, at every level.
TEST(CpuCheckpointingTest, PlannedActivationBytesAreTheModelsOwn) {
  for (Checkpointing level :
       {Checkpointing::kNone, Checkpointing::kSelective, Checkpointing::kFull}) {
    SCOPED_TRACE(CheckpointingName(level));
    EXPECT_EQ(cpu::GptModel<float>::PlannedActivationBytes(Gpt(), kMaxB, kMaxT, level),
              GptCpu(Gpt(), kMaxB, kMaxT, level).ActivationBytes());
    for (bool tied : {false, true}) {
      EXPECT_EQ(cpu::LlamaModel<float>::PlannedActivationBytes(Llama(tied), kMaxB, kMaxT, level),
                LlamaCpu(Llama(tied), kMaxB, kMaxT, level).ActivationBytes());
    }
  }
}

}  // namespace
}  // namespace weft::engine
