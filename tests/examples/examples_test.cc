// Every job spec in examples/ is one a user can submit as it stands: it parses, and the
// coordinator's defaults and validation (NormalizeJobSpec) accept it. The Llama examples also
// keep the shapes of the real models they claim to be, and fortunes-spm reads what the demo
// prepares.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const fs::path kExamples = fs::path(WEFT_SOURCE_DIR) / "examples";

std::set<std::string> ExampleSpecs() {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(kExamples)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.ends_with(".pb.txt")) names.insert(name);
  }
  return names;
}

absl::StatusOr<weft::v1::JobSpec> LoadExample(const std::string& name) {
  auto spec = ReadJobSpecFile((kExamples / name).string());
  if (!spec.ok()) return spec.status();
  return NormalizeJobSpec(*std::move(spec));
}

TEST(ExamplesTest, EverySpecParsesAndIsValid) {
  const std::set<std::string> names = ExampleSpecs();
  // The listing itself must work, or the loop below would check nothing.
  EXPECT_THAT(names, ::testing::IsSupersetOf({"fortunes-char.pb.txt", "fortunes-spm.pb.txt",
                                              "llama-gpu.pb.txt",
                                              "llama-continue-from-hf.pb.txt"}));
  for (const std::string& name : names) {
    auto spec = LoadExample(name);
    EXPECT_TRUE(spec.ok()) << name << ": " << spec.status();
  }
}

std::string ReadSource(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// scripts/demo.sh makes the dataset this spec reads: where the spec looks, with a tokenizer of
// the spec's vocabulary.
TEST(ExamplesTest, FortunesSpmReadsWhatTheDemoPrepares) {
  auto spec = LoadExample("fortunes-spm.pb.txt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string demo = ReadSource(fs::path(WEFT_SOURCE_DIR) / "scripts" / "demo.sh");
  ASSERT_THAT(demo, HasSubstr("examples/fortunes-spm.pb.txt"));
  EXPECT_EQ(spec->data().manifest_path(), "/tmp/weft-fortunes/data");
  EXPECT_THAT(demo, HasSubstr("DATA=/tmp/weft-fortunes\n"));
  EXPECT_THAT(demo, HasSubstr("--out \"$DATA/data\""));
  EXPECT_THAT(demo, HasSubstr(absl::StrCat("--vocab-size ", spec->model().vocab_size(), " ")));
  EXPECT_EQ(spec->resources().device_kind(), weft::v1::DEVICE_KIND_CPU);
}

// Published parameter counts: Llama-3.2-1B 1,235,814,400 (tied head); Llama-3-8B
// 8,030,261,248 (untied). A typo in any size of the examples changes them.
TEST(ExamplesTest, LlamaGpuIsLlama32OneBShaped) {
  auto spec = LoadExample("llama-gpu.pb.txt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().architecture(), weft::v1::LLAMA);
  EXPECT_EQ(ModelParameterCount(spec->model()), 1235814400);
  EXPECT_EQ(spec->model().rope_scaling().kind(), weft::v1::RopeScaling::LLAMA3);
  EXPECT_EQ(spec->data().format(), weft::v1::DATA_FORMAT_UINT32_BIN);
  EXPECT_EQ(spec->precision(), weft::v1::BF16);
  EXPECT_EQ(spec->zero_stage(), 3);
  EXPECT_EQ(spec->resources().device_kind(), weft::v1::DEVICE_KIND_CUDA);
}

// The families' examples: Qwen3-8B's published count (8,190,735,360) and Mistral-7B-v0.1's
// (7,241,732,096), with the features that make them those families.
TEST(ExamplesTest, FamilyExamplesAreQwen3EightBAndMistralSevenBShaped) {
  auto qwen3 = LoadExample("qwen3-8b-gpu.pb.txt");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->model().architecture(), weft::v1::QWEN3);
  EXPECT_EQ(qwen3->model().head_dim(), 128);
  EXPECT_EQ(ModelParameterCount(qwen3->model()), 8190735360);
  auto mistral = LoadExample("mistral-7b-gpu.pb.txt");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->model().architecture(), weft::v1::MISTRAL);
  EXPECT_EQ(mistral->model().sliding_window(), 4096);
  EXPECT_EQ(mistral->training().sequence_length(), 16384);
  EXPECT_EQ(ModelParameterCount(mistral->model()), 7241732096);
}

TEST(ExamplesTest, LlamaContinueFromHfIsLlama3EightBShaped) {
  auto spec = LoadExample("llama-continue-from-hf.pb.txt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().architecture(), weft::v1::LLAMA);
  EXPECT_EQ(ModelParameterCount(spec->model()), 8030261248);
  EXPECT_FALSE(spec->model().tie_word_embeddings());
  EXPECT_FALSE(spec->init_from_hf_dir().empty());
  EXPECT_EQ(spec->data().format(), weft::v1::DATA_FORMAT_UINT32_BIN);
  // Continued pretraining: well below Llama 3's pretraining peak of 3e-4, with a warmup.
  EXPECT_LE(spec->optimizer().learning_rate(), 1e-4);
  EXPECT_GT(spec->lr_schedule().warmup_steps(), 0);
}

}  // namespace
}  // namespace weft
