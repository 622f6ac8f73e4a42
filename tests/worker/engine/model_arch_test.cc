// The architecture interface: the factory, what Gpt2Arch answers (the same layout and bits as
// the GPT-2 free functions the device models were tested with), the shared table helpers, and
// the CPU registry building the same model as a direct GptCpu.
#include "worker/engine/model_arch.h"

#include <cstdint>
#include <vector>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/engine/cpu/gpt2_model.h"
#include "worker/engine/cpu/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"

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
  const std::unique_ptr<cpu::CpuModel> created = cpu::CreateCpuModel(a, 2, 4);
  GptCpu direct(ConfigFromSpec(Tiny()), 2, 4);
  const float loss = loss_of(*created);
  EXPECT_GT(loss, 0.0f);
  EXPECT_EQ(loss, loss_of(direct));
  EXPECT_EQ(created->ActivationBytes(), direct.ActivationBytes());
}

}  // namespace
}  // namespace weft::engine
