// The architecture interface: the factory, what Gpt2Arch answers (the same layout and bits as
// the GPT-2 free functions the device models were tested with), the shared table helpers, and
// the CPU registry building the same model as a direct GptCpu.
#include "worker/engine/model_arch.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/engine/cpu/gpt2_model.h"
#include "worker/engine/cpu/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine {
namespace {

weft::v1::ModelSpec Spec(int layers, int hidden, int heads, int vocab, int padded, int context) {
  weft::v1::ModelSpec spec;
  spec.set_num_layers(layers);
  spec.set_hidden_size(hidden);
  spec.set_num_heads(heads);
  spec.set_vocab_size(vocab);
  spec.set_padded_vocab_size(padded);
  spec.set_context_length(context);
  return spec;
}

// padded_vocab_size 0: the proto's default (a multiple of 128), 50304 here.
weft::v1::ModelSpec Gpt2Small() { return Spec(12, 768, 12, 50257, 0, 1024); }
weft::v1::ModelSpec Tiny() { return Spec(2, 8, 2, 11, 16, 6); }

TEST(MakeModelArchTest, Gpt2SmallFiguresMatchTheSpecsCount) {
  auto arch = MakeModelArch(Gpt2Small());
  ASSERT_TRUE(arch.ok()) << arch.status();
  const ModelArch& a = **arch;
  EXPECT_EQ(a.name(), "gpt2");
  EXPECT_EQ(a.num_layers(), 12);
  EXPECT_EQ(a.NumUnits(), 13);
  EXPECT_EQ(a.vocab_size(), 50257);
  EXPECT_EQ(a.padded_vocab_size(), 50304);
  EXPECT_EQ(a.context_length(), 1024);
  EXPECT_EQ(a.ParameterCount(), 124475904u);
  // The coordinator's count (common/job_spec.h, of a normalized spec: padding filled in) and
  // the engine's must never drift apart.
  weft::v1::ModelSpec normalized = Gpt2Small();
  normalized.set_padded_vocab_size(a.padded_vocab_size());
  EXPECT_EQ(static_cast<int64_t>(a.ParameterCount()), ModelParameterCount(normalized));
}

TEST(MakeModelArchTest, RefusesShapesNoArchitectureTakes) {
  weft::v1::ModelSpec spec = Tiny();
  spec.set_num_heads(3);  // does not divide 8
  auto arch = MakeModelArch(spec);
  ASSERT_FALSE(arch.ok());
  EXPECT_EQ(arch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(arch.status().message().find("num_heads 3"), absl::string_view::npos)
      << arch.status();
  spec = Tiny();
  spec.set_num_layers(0);
  EXPECT_EQ(MakeModelArch(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec = Tiny();
  spec.set_padded_vocab_size(8);  // fewer rows than tokens
  EXPECT_EQ(MakeModelArch(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Gpt2ArchTest, AnswersExactlyTheGpt2Layout) {
  auto arch = MakeModelArch(Tiny());
  ASSERT_TRUE(arch.ok()) << arch.status();
  const ModelArch& a = **arch;
  const GptConfig config = ConfigFromSpec(Tiny());
  ASSERT_EQ(a.NumUnits(), NumUnits(config));
  for (int u = 0; u < a.NumUnits(); ++u) {
    ASSERT_EQ(a.UnitSize(u), UnitSize(config, u)) << "unit " << u;
    const std::vector<TensorInfo> got = a.UnitTensors(u);
    const std::vector<TensorInfo> want = UnitTensors(config, u);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].name, want[k].name);
      EXPECT_EQ(got[k].offset, want[k].offset);
      EXPECT_EQ(got[k].shape, want[k].shape);
    }
    std::vector<float> via_arch(a.UnitSize(u)), direct(a.UnitSize(u));
    a.InitUnit(u, 42, via_arch.data());
    InitUnit(config, u, 42, direct.data());
    EXPECT_EQ(via_arch, direct) << "unit " << u;
    std::vector<uint8_t> mask_arch(a.UnitSize(u), 7), mask_direct(a.UnitSize(u), 9);
    a.UnitDecayMask(u, mask_arch.data());
    UnitDecayMask(config, u, mask_direct.data());
    EXPECT_EQ(mask_arch, mask_direct) << "unit " << u;
  }
}

// The tiny Llama the reference fixtures use (tests/fixtures/hf): GQA 4/2, SwiGLU 176, vocab 300.
weft::v1::ModelSpec TinyLlama(bool tied) {
  weft::v1::ModelSpec spec = Spec(2, 64, 4, 300, 0, 64);
  spec.set_architecture(weft::v1::LLAMA);
  spec.set_num_kv_heads(2);
  spec.set_intermediate_size(176);
  spec.set_tie_word_embeddings(tied);
  return spec;
}

TEST(LlamaArchTest, LayoutStacksHuggingFaceMatricesAndCountsMatchTheSpecs) {
  for (bool tied : {false, true}) {
    auto arch = MakeModelArch(TinyLlama(tied));
    ASSERT_TRUE(arch.ok()) << arch.status();
    const ModelArch& a = **arch;
    EXPECT_EQ(a.name(), "llama");
    EXPECT_EQ(a.NumUnits(), 3);
    EXPECT_EQ(a.padded_vocab_size(), 384);
    const std::vector<TensorInfo> head = a.UnitTensors(0);
    ASSERT_EQ(head.size(), tied ? 2u : 3u);
    EXPECT_EQ(head[kLlamaEmbed].name, "embed");
    EXPECT_EQ(head[kLlamaEmbed].shape, (std::vector<int64_t>{384, 64}));
    EXPECT_EQ(head[kLlamaEmbed].live_size, 300u * 64);
    EXPECT_EQ(head[kLlamaNorm].name, "norm");
    if (!tied) EXPECT_EQ(head[kLlamaLmHead].name, "lm_head");
    const std::vector<TensorInfo> block = a.UnitTensors(2);
    ASSERT_EQ(block.size(), static_cast<size_t>(kLlamaNumBlockTensors));
    EXPECT_EQ(block[kLlamaQkvw].name, "layers.1.qkvw");
    EXPECT_EQ(block[kLlamaQkvw].shape, (std::vector<int64_t>{64 + 2 * 32, 64}));
    EXPECT_EQ(block[kLlamaAttnOut].shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(block[kLlamaGateUp].shape, (std::vector<int64_t>{2 * 176, 64}));
    EXPECT_EQ(block[kLlamaDown].shape, (std::vector<int64_t>{64, 176}));
    EXPECT_EQ(a.UnitSize(1), block.back().offset + block.back().size);
    weft::v1::ModelSpec normalized = TinyLlama(tied);
    normalized.set_padded_vocab_size(384);
    EXPECT_EQ(static_cast<int64_t>(a.ParameterCount()), ModelParameterCount(normalized));
  }
}

TEST(LlamaArchTest, InitZeroesVocabularyPaddingAndSetsNormsToOne) {
  auto arch = MakeModelArch(TinyLlama(false));
  ASSERT_TRUE(arch.ok()) << arch.status();
  const ModelArch& a = **arch;
  std::vector<float> head(a.UnitSize(0));
  a.InitUnit(0, 5, head.data());
  const std::vector<TensorInfo> t = a.UnitTensors(0);
  for (int k : {kLlamaEmbed, kLlamaLmHead}) {
    const TensorInfo& info = t[k];
    EXPECT_NE(head[info.offset + info.live_size - 1], 0.0f) << info.name;
    for (size_t i = info.live_size; i < info.size; ++i) {
      ASSERT_EQ(head[info.offset + i], 0.0f) << info.name << " padding element " << i;
    }
  }
  EXPECT_EQ(head[t[kLlamaNorm].offset], 1.0f);
  std::vector<float> again(a.UnitSize(0));
  a.InitUnit(0, 5, again.data());
  EXPECT_EQ(head, again);
  a.InitUnit(0, 6, again.data());
  EXPECT_NE(head, again);
}

TEST(LlamaArchTest, RotaryFrequenciesWithAndWithoutLlama3Scaling) {
  LlamaConfig c;
  c.num_layers = 1;
  c.hidden_size = 64;
  c.num_heads = 4;  // D = 16: 8 frequencies
  c.num_kv_heads = 2;
  c.rope_theta = 10000.0;
  std::vector<double> f = RopeInverseFrequencies(c);
  ASSERT_EQ(f.size(), 8u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_DOUBLE_EQ(f[1], std::pow(10000.0, -2.0 / 16));
  EXPECT_DOUBLE_EQ(f[7], std::pow(10000.0, -14.0 / 16));
  // original context 16, low 1, high 4: wavelengths above 16 are divided by 8, below 4 kept,
  // between blended. f[0] has wavelength 2 pi (between): smooth = (16 / 2 pi - 1) / 3.
  c.rope_llama3 = true;
  c.rope_factor = 8;
  c.rope_low_freq_factor = 1;
  c.rope_high_freq_factor = 4;
  c.rope_original_context_length = 16;
  const std::vector<double> scaled = RopeInverseFrequencies(c);
  const double smooth = (16.0 / (2 * M_PI) - 1.0) / 3.0;
  EXPECT_DOUBLE_EQ(scaled[0], (1 - smooth) * 1.0 / 8 + smooth * 1.0);
  EXPECT_DOUBLE_EQ(scaled[7], f[7] / 8);  // wavelength ~ 4600 > 16
}

TEST(MakeModelArchTest, RefusesLlamaShapesWithReasons) {
  weft::v1::ModelSpec spec = TinyLlama(false);
  spec.set_num_kv_heads(3);
  auto arch = MakeModelArch(spec);
  ASSERT_FALSE(arch.ok());
  EXPECT_NE(arch.status().message().find("num_kv_heads 3 does not divide num_heads 4"),
            absl::string_view::npos) << arch.status();
  spec = TinyLlama(false);
  spec.set_intermediate_size(0);
  EXPECT_EQ(MakeModelArch(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTableTest, AppendTensorTilesAndFillDecayMaskFollowsTheTable) {
  std::vector<TensorInfo> t;
  AppendTensor(&t, "w", {3, 2}, true, TensorInit::kNormal);
  AppendTensor(&t, "b", {3}, false, TensorInit::kZeros);
  AppendTensor(&t, "g", {2}, true, TensorInit::kOnes);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].offset, 0u);
  EXPECT_EQ(t[0].size, 6u);
  EXPECT_EQ(t[1].offset, 6u);
  EXPECT_EQ(t[2].offset, 9u);
  EXPECT_EQ(t[2].size, 2u);
  std::vector<uint8_t> mask(11, 5);
  FillDecayMask(t, mask.data());
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1}));
}

TEST(InitNoiseTest, StreamsDifferBySeedAndUnitAndAreStandardNormal) {
  EXPECT_NE(InitStreamKey(1, 0), InitStreamKey(2, 0));
  EXPECT_NE(InitStreamKey(1, 0), InitStreamKey(1, 1));
  const uint64_t key = InitStreamKey(7, 3);
  EXPECT_EQ(StandardNormalAt(key, 12), StandardNormalAt(key, 12));
  double sum = 0, squares = 0;
  constexpr int kN = 20000;
  for (int i = 0; i < kN; ++i) {
    const double x = StandardNormalAt(key, i);
    sum += x;
    squares += x * x;
  }
  EXPECT_NEAR(sum / kN, 0.0, 0.03);
  EXPECT_NEAR(squares / kN, 1.0, 0.05);
}

TEST(CreateCpuModelTest, BuildsTheSameModelAsGptCpu) {
  auto arch = MakeModelArch(Tiny());
  ASSERT_TRUE(arch.ok()) << arch.status();
  const ModelArch& a = **arch;
  std::vector<std::vector<float>> params(a.NumUnits());
  for (int u = 0; u < a.NumUnits(); ++u) {
    params[u].resize(a.UnitSize(u));
    a.InitUnit(u, 3, params[u].data());
  }
  const std::vector<int32_t> tokens = {1, 4, 9, 2, 0, 3, 3, 10};
  const std::vector<int32_t> targets = {4, 9, 2, 0, 3, 3, 10, 5};
  auto loss_of = [&](cpu::CpuModel& model) {
    model.SetShape(2, 4);
    model.EncoderForward(params[0].data(), tokens.data());
    for (int l = 0; l < a.num_layers(); ++l) model.BlockForward(l, params[1 + l].data());
    return model.ClassifierForward(params[0].data(), targets.data(), 1.0f);
  };
  // A level other than kNone: the registry must pass it on.
  const std::unique_ptr<cpu::CpuModel> created =
      cpu::CreateCpuModel(a, 2, 4, Checkpointing::kSelective);
  GptCpu direct(ConfigFromSpec(Tiny()), 2, 4, Checkpointing::kSelective);
  EXPECT_EQ(created->checkpointing(), Checkpointing::kSelective);
  const float loss = loss_of(*created);
  EXPECT_GT(loss, 0.0f);
  EXPECT_EQ(loss, loss_of(direct));
  EXPECT_EQ(created->ActivationBytes(), direct.ActivationBytes());
}

}  // namespace
}  // namespace weft::engine
