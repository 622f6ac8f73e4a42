// The architecture interface: the factory, what Gpt2Arch answers (the same layout and bits as
// the GPT-2 free functions the device models were tested with), the shared table helpers, and
// the CPU registry building the same model as a direct GptCpu.
#include "worker/engine/model_arch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/engine/unregistered_arch.h"
#include "worker/engine/cpu/gpt2_model.h"
#include "worker/engine/cpu/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine {
namespace {

using ::testing::HasSubstr;

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
  EXPECT_EQ(a.HeadOutputBegin(), 0u);  // tied: wte is read at both ends
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
    // Untied, the embedding alone is read at the start and the final norm and LM head alone
    // at the end; tied, the embedding is read at both.
    EXPECT_EQ(a.HeadOutputBegin(), tied ? 0u : head[kLlamaNorm].offset);
    const std::vector<TensorInfo> block = a.UnitTensors(2);
    // Plain Llama has none of the families' own tensors, numbered from kLlamaQkvb.
    ASSERT_EQ(block.size(), static_cast<size_t>(kLlamaQkvb));
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

// The families' own tensors: where BlockOffsets finds them, their shapes and init (biases 0,
// head norms 1, neither decayed), the model file name, and the count the coordinator uses.
TEST(LlamaArchTest, FamiliesAddTheirTensorsAfterQkvw) {
  struct Case {
    weft::v1::Architecture architecture;
    int head_dim;
    const char* name;
    std::vector<std::string> extra;  // after qkvw, in order
  };
  for (const Case& c : {Case{weft::v1::QWEN2, 0, "qwen2", {"qkvb"}},
                        Case{weft::v1::QWEN3, 32, "qwen3", {"q_norm", "k_norm"}},
                        Case{weft::v1::MISTRAL, 0, "mistral", {}}}) {
    weft::v1::ModelSpec spec = TinyLlama(false);
    spec.set_architecture(c.architecture);
    spec.set_head_dim(c.head_dim);
    if (c.architecture == weft::v1::MISTRAL) spec.set_sliding_window(8);
    auto arch = MakeModelArch(spec);
    ASSERT_TRUE(arch.ok()) << arch.status();
    const auto& a = dynamic_cast<const LlamaArch&>(**arch);
    EXPECT_EQ(a.name(), c.name);
    const int d = c.head_dim > 0 ? c.head_dim : 16;
    const int64_t qkv = (4 + 2 * 2) * d;
    const std::vector<TensorInfo> block = a.UnitTensors(1);
    ASSERT_EQ(block.size(), 6 + c.extra.size()) << c.name;
    EXPECT_EQ(block[1].shape, (std::vector<int64_t>{qkv, 64}));
    for (size_t i = 0; i < c.extra.size(); ++i) {
      EXPECT_EQ(block[2 + i].name, "layers.0." + c.extra[i]);
      EXPECT_FALSE(block[2 + i].decay);
    }
    EXPECT_EQ(block[2 + c.extra.size()].name, "layers.0.attn_out");
    EXPECT_EQ(block[2 + c.extra.size()].shape, (std::vector<int64_t>{64, 4 * d}));
    const LlamaBlockOffsets offsets = a.BlockOffsets();
    EXPECT_EQ(offsets[kLlamaAttnOut], block[2 + c.extra.size()].offset);
    EXPECT_EQ(offsets[kLlamaDown], block.back().offset);
    std::vector<float> unit(a.UnitSize(1));
    a.InitUnit(1, 3, unit.data());
    if (c.architecture == weft::v1::QWEN2) {
      ASSERT_NE(offsets[kLlamaQkvb], kLlamaAbsent);
      EXPECT_EQ(block[2].shape, (std::vector<int64_t>{qkv}));
      for (int64_t i = 0; i < qkv; ++i) ASSERT_EQ(unit[offsets[kLlamaQkvb] + i], 0.0f);
    } else {
      EXPECT_EQ(offsets[kLlamaQkvb], kLlamaAbsent);
    }
    if (c.architecture == weft::v1::QWEN3) {
      for (int k : {kLlamaQNorm, kLlamaKNorm}) {
        ASSERT_NE(offsets[k], kLlamaAbsent);
        for (int i = 0; i < d; ++i) ASSERT_EQ(unit[offsets[k] + i], 1.0f);
      }
    } else {
      EXPECT_EQ(offsets[kLlamaQNorm], kLlamaAbsent);
      EXPECT_EQ(offsets[kLlamaKNorm], kLlamaAbsent);
    }
    weft::v1::ModelSpec normalized = spec;
    normalized.set_padded_vocab_size(384);
    EXPECT_EQ(static_cast<int64_t>(a.ParameterCount()), ModelParameterCount(normalized)) << c.name;
  }
}

TEST(LlamaArchTest, RefusesAWindowOutsideMistralAndAnOddHeadDim) {
  weft::v1::ModelSpec spec = TinyLlama(false);
  spec.set_sliding_window(8);
  auto arch = MakeModelArch(spec);
  ASSERT_FALSE(arch.ok());
  EXPECT_THAT(std::string(arch.status().message()), HasSubstr("sliding_window 8"));
  spec = TinyLlama(false);
  spec.set_architecture(weft::v1::QWEN3);
  spec.set_head_dim(15);
  arch = MakeModelArch(spec);
  ASSERT_FALSE(arch.ok());
  EXPECT_THAT(std::string(arch.status().message()), HasSubstr("not a QWEN3 shape"));
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

// The init rule spelled out element by element, independently of InitTensorRange's chunking:
// what a whole unit must hold.
std::vector<float> ReferenceInit(const ModelArch& a, int unit, uint64_t seed) {
  const uint64_t key = InitStreamKey(seed, unit);
  const double residual_std = 0.02 / std::sqrt(2.0 * a.num_layers());
  std::vector<float> out(a.UnitSize(unit), -1.0f);
  for (const TensorInfo& t : a.UnitTensors(unit)) {
    for (size_t i = 0; i < t.size; ++i) {
      const size_t index = t.offset + i;
      float v = 0.0f;
      if (i < t.live_size && t.init == TensorInit::kNormal) {
        v = static_cast<float>(0.02 * StandardNormalAt(key, index));
      } else if (i < t.live_size && t.init == TensorInit::kResidualNormal) {
        v = static_cast<float>(residual_std * StandardNormalAt(key, index));
      } else if (i < t.live_size && t.init == TensorInit::kOnes) {
        v = 1.0f;
      }
      out[index] = v;
    }
  }
  return out;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Ranges at every awkward place of `unit`: around each tensor's start (across the boundary),
// around the end of its live part (into vocabulary padding), inside one tensor, empty, whole,
// and some random ones.
std::vector<std::pair<size_t, size_t>> AwkwardRanges(const ModelArch& a, int unit) {
  const size_t size = a.UnitSize(unit);
  std::vector<std::pair<size_t, size_t>> ranges = {{0, size}, {0, 0}, {size, size}, {0, 1},
                                                   {size - 1, size}};
  for (const TensorInfo& t : a.UnitTensors(unit)) {
    ranges.push_back({t.offset > 3 ? t.offset - 3 : 0, std::min(size, t.offset + 5)});
    const size_t live_end = t.offset + t.live_size;
    ranges.push_back({live_end - 1, std::min(size, live_end + 7)});
    ranges.push_back({t.offset + t.size / 3, t.offset + (2 * t.size) / 3 + 1});
  }
  std::mt19937_64 rng(unit);
  for (int i = 0; i < 20; ++i) {
    size_t b = rng() % (size + 1), e = rng() % (size + 1);
    if (b > e) std::swap(b, e);
    ranges.push_back({b, e});
  }
  return ranges;
}

class InitRangeTest : public ::testing::TestWithParam<weft::v1::ModelSpec> {};

// Any range of a unit, on any number of threads, is bit for bit that slice of the whole unit,
// which is the init rule applied element by element.
TEST_P(InitRangeTest, EveryRangeIsTheSliceOfTheWholeUnitOnAnyThreadCount) {
  auto arch = MakeModelArch(GetParam());
  ASSERT_TRUE(arch.ok()) << arch.status();
  const ModelArch& a = **arch;
  for (int u = 0; u < a.NumUnits(); ++u) {
    const size_t size = a.UnitSize(u);
    const std::vector<float> reference = ReferenceInit(a, u, 77);
    std::vector<float> whole(size, 5.0f);
    a.InitUnit(u, 77, whole.data());
    ASSERT_TRUE(SameBits(whole.data(), reference.data(), size)) << "unit " << u;
    std::vector<uint8_t> mask(size);
    a.UnitDecayMask(u, mask.data());
    for (const auto& [begin, end] : AwkwardRanges(a, u)) {
      for (int threads : {1, 3, 0}) {
        std::vector<float> part(end - begin + 1, 9.0f);  // one guard element past the range
        a.InitUnitRange(u, 77, begin, end, part.data(), threads);
        ASSERT_TRUE(SameBits(part.data(), whole.data() + begin, end - begin))
            << "unit " << u << " [" << begin << ", " << end << ") threads " << threads;
        ASSERT_EQ(part.back(), 9.0f) << "wrote past the range";
      }
      std::vector<uint8_t> mask_part(end - begin + 1, 7);
      a.UnitDecayMaskRange(u, begin, end, mask_part.data());
      ASSERT_TRUE(std::equal(mask_part.begin(), mask_part.end() - 1, mask.begin() + begin))
          << "unit " << u << " mask [" << begin << ", " << end << ")";
      ASSERT_EQ(mask_part.back(), 7);
    }
  }
}

// Enough elements that the automatic thread count cuts a unit into several chunks.
weft::v1::ModelSpec WideLlama() {
  weft::v1::ModelSpec spec = Spec(1, 256, 4, 1000, 0, 16);
  spec.set_architecture(weft::v1::LLAMA);
  spec.set_num_kv_heads(2);
  spec.set_intermediate_size(512);
  return spec;
}

INSTANTIATE_TEST_SUITE_P(Shapes, InitRangeTest,
                         ::testing::Values(Tiny(), Spec(3, 16, 4, 50, 0, 9), TinyLlama(false),
                                           TinyLlama(true)));

TEST(InitThreadsTest, ThreadCountNeverChangesTheBits) {
  auto arch = MakeModelArch(WideLlama());
  ASSERT_TRUE(arch.ok()) << arch.status();
  const ModelArch& a = **arch;
  const size_t size = a.UnitSize(0);
  const std::vector<float> reference = ReferenceInit(a, 0, 3);
  // The whole unit, and ranges starting and ending inside tensors and in vocabulary padding.
  const std::pair<size_t, size_t> ranges[] = {{0, size}, {1, size - 1}, {size / 3 + 1, size - 5}};
  for (const auto& [begin, end] : ranges) {
    for (int threads : {1, 3, 7, 0}) {
      std::vector<float> got(end - begin, 4.0f);
      a.InitUnitRange(0, 3, begin, end, got.data(), threads);
      EXPECT_TRUE(SameBits(got.data(), reference.data() + begin, end - begin))
          << "[" << begin << ", " << end << ") on " << threads << " threads";
    }
  }
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

// An architecture the CPU registry does not know (as a new family is, until its CPU model is
// registered): an error naming it from every entry point, never an abort.
TEST(CpuModelRegistryTest, AnArchitectureWithoutACpuModelIsAnError) {
  const testing::UnregisteredArch arch;
  const absl::Status found = cpu::FindCpuModel(arch).status();
  EXPECT_EQ(found.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(found.message().find("unregistered"), std::string::npos) << found;
  EXPECT_EQ(cpu::CreateCpuModel(arch, 1, 4, Checkpointing::kNone).status(), found);
  EXPECT_EQ(cpu::PlanCpuActivationBytes(arch, 1, 4, Checkpointing::kNone).status(), found);
}

TEST(CpuModelRegistryTest, EveryBuiltInArchitectureHasACpuModel) {
  for (const weft::v1::ModelSpec& spec : {Tiny(), TinyLlama(/*tied=*/false)}) {
    auto arch = MakeModelArch(spec);
    ASSERT_TRUE(arch.ok()) << arch.status();
    auto model = cpu::FindCpuModel(**arch);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->create(2, 4, Checkpointing::kNone)->ActivationBytes(),
              model->activation_bytes(2, 4, Checkpointing::kNone));
  }
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
  auto made = cpu::CreateCpuModel(a, 2, 4, Checkpointing::kSelective);
  ASSERT_TRUE(made.ok()) << made.status();
  const std::unique_ptr<cpu::CpuModel> created = *std::move(made);
  GptCpu direct(ConfigFromSpec(Tiny()), 2, 4, Checkpointing::kSelective);
  EXPECT_EQ(created->checkpointing(), Checkpointing::kSelective);
  const float loss = loss_of(*created);
  EXPECT_GT(loss, 0.0f);
  EXPECT_EQ(loss, loss_of(direct));
  EXPECT_EQ(created->ActivationBytes(), direct.ActivationBytes());
}

}  // namespace
}  // namespace weft::engine
