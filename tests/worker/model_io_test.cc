// The trained-model file and sampling for Llama: a saved model loads back bit for bit under
// its architecture, samples deterministically (greedy sampling follows the model's own argmax),
// and a file that lacks a tensor its spec needs is refused naming it.
#include "worker/model_io.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/data/safetensors.h"
#include "worker/engine/cpu/model.h"

namespace weft::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

weft::v1::JobSpec TinyLlamaSpec(bool tied) {
  weft::v1::JobSpec spec;
  auto* m = spec.mutable_model();
  m->set_architecture(weft::v1::LLAMA);
  m->set_num_layers(2);
  m->set_hidden_size(16);
  m->set_num_heads(4);
  m->set_num_kv_heads(2);
  m->set_intermediate_size(24);
  m->set_vocab_size(50);
  m->set_context_length(8);
  m->set_tie_word_embeddings(tied);
  return spec;
}

std::vector<std::vector<float>> InitialUnits(const engine::ModelArch& arch, uint64_t seed) {
  std::vector<std::vector<float>> units(arch.NumUnits());
  for (int u = 0; u < arch.NumUnits(); ++u) {
    units[u].resize(arch.UnitSize(u));
    arch.InitUnit(u, seed, units[u].data());
  }
  return units;
}

// The most likely next token of `tokens` (the last position's argmax over the real vocabulary).
int32_t Argmax(const LoadedModel& model, const std::vector<int32_t>& tokens) {
  const engine::ModelArch& arch = *model.arch;
  const int t = static_cast<int>(tokens.size());
  auto cpu = engine::cpu::CreateCpuModel(arch, 1, t, engine::Checkpointing::kNone);
  cpu->SetShape(1, t);
  cpu->EncoderForward(model.units[0].data(), tokens.data());
  for (int l = 0; l < arch.num_layers(); ++l) cpu->BlockForward(l, model.units[1 + l].data());
  cpu->ClassifierForward(model.units[0].data(), nullptr, 0.0f);
  const float* row = cpu->Logits() + static_cast<size_t>(t - 1) * arch.padded_vocab_size();
  return static_cast<int32_t>(std::max_element(row, row + arch.vocab_size()) - row);
}

TEST(ModelIoTest, LlamaSavesLoadsAndSamples) {
  weft::testing::TempDir dir;
  for (bool tied : {false, true}) {
    const weft::v1::JobSpec spec = TinyLlamaSpec(tied);
    auto arch = engine::MakeModelArch(spec.model());
    ASSERT_TRUE(arch.ok()) << arch.status();
    const std::vector<std::vector<float>> units = InitialUnits(**arch, 5);
    const std::string path = dir.File(tied ? "tied.safetensors" : "untied.safetensors");
    ASSERT_TRUE(SaveModel(path, spec, units).ok());

    auto loaded = LoadModel(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->arch->name(), "llama");
    EXPECT_EQ(loaded->units, units);
    EXPECT_EQ(loaded->arch->UnitTensors(0).size(), tied ? 2u : 3u);

    SampleOptions options;
    options.tokens = 12;  // past the context of 8: the window slides
    auto a = GenerateText(*loaded, "3 14 15", options);
    auto b = GenerateText(*loaded, "3 14 15", options);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*a, *b);
    const std::vector<std::string> ids = absl::StrSplit(*a, ' ');
    ASSERT_EQ(ids.size(), 12u);
    for (const std::string& id : ids) {
      int v = -1;
      ASSERT_TRUE(absl::SimpleAtoi(id, &v)) << id;
      EXPECT_GE(v, 0);
      EXPECT_LT(v, 50);
    }

    options.temperature = 0;  // greedy
    options.tokens = 1;
    auto greedy = GenerateText(*loaded, "3 14 15", options);
    ASSERT_TRUE(greedy.ok());
    EXPECT_EQ(*greedy, std::to_string(Argmax(*loaded, {3, 14, 15})));

    EXPECT_THAT(GenerateText(*loaded, "3 50", options).status().message(),
                HasSubstr("token ids in [0, 50)"));
  }
}

TEST(ModelIoTest, LlamaFileWithoutItsLmHeadIsRefusedNamingIt) {
  weft::testing::TempDir dir;
  // The tensors of a tied model under a spec that says untied.
  const weft::v1::JobSpec tied = TinyLlamaSpec(true);
  auto arch = engine::MakeModelArch(tied.model());
  ASSERT_TRUE(arch.ok());
  const std::vector<std::vector<float>> units = InitialUnits(**arch, 6);
  std::vector<data::TensorData> tensors;
  for (int u = 0; u < (*arch)->NumUnits(); ++u) {
    for (const engine::TensorInfo& t : (*arch)->UnitTensors(u)) {
      tensors.push_back(
          {t.name, t.shape,
           std::vector<float>(units[u].begin() + t.offset, units[u].begin() + t.offset + t.size)});
    }
  }
  std::string untied_text;
  google::protobuf::TextFormat::PrintToString(TinyLlamaSpec(false), &untied_text);
  const std::string path = dir.File("model.safetensors");
  ASSERT_TRUE(data::WriteSafetensors(path, tensors, {{"weft.job_spec", untied_text}}).ok());
  auto loaded = LoadModel(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("tensor lm_head missing"));
}

// The streamed file, written a unit at a time, is SaveModel's file byte for byte, and appears
// under its name only once committed.
TEST(ModelFileWriterTest, StreamsSaveModelsBytesAndAppearsOnlyOnCommit) {
  weft::testing::TempDir dir;
  weft::v1::JobSpec gpt2;
  gpt2.mutable_model()->set_num_layers(3);
  gpt2.mutable_model()->set_hidden_size(8);
  gpt2.mutable_model()->set_num_heads(2);
  gpt2.mutable_model()->set_vocab_size(11);
  gpt2.mutable_model()->set_context_length(6);
  for (const weft::v1::JobSpec& spec : {TinyLlamaSpec(false), TinyLlamaSpec(true), gpt2}) {
    auto arch = engine::MakeModelArch(spec.model());
    ASSERT_TRUE(arch.ok()) << arch.status();
    const std::vector<std::vector<float>> units = InitialUnits(**arch, 8);
    const std::string whole = dir.File("whole.safetensors");
    ASSERT_TRUE(SaveModel(whole, spec, units).ok());

    const std::string streamed = dir.File("streamed.safetensors");
    auto writer = ModelFileWriter::Begin(streamed, spec);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (int u = 0; u < (*arch)->NumUnits(); ++u) {
      ASSERT_TRUE((*writer)->WriteUnit(u, units[u]).ok());
      EXPECT_FALSE(std::filesystem::exists(streamed)) << "visible before commit";
    }
    ASSERT_TRUE((*writer)->Commit().ok());
    EXPECT_EQ(weft::testing::ReadFile(streamed), weft::testing::ReadFile(whole));
    // No temporary file is left beside them.
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 2);
    std::filesystem::remove(whole);
    std::filesystem::remove(streamed);
  }
}

TEST(ModelFileWriterTest, RefusesUnitsOutOfOrderOrMisSizedAndAnEarlyCommit) {
  weft::testing::TempDir dir;
  const weft::v1::JobSpec spec = TinyLlamaSpec(false);
  auto arch = engine::MakeModelArch(spec.model());
  ASSERT_TRUE(arch.ok());
  const std::vector<std::vector<float>> units = InitialUnits(**arch, 2);
  const std::string path = dir.File("model.safetensors");
  {
    auto writer = ModelFileWriter::Begin(path, spec);
    ASSERT_TRUE(writer.ok()) << writer.status();
    absl::Status s = (*writer)->WriteUnit(1, units[1]);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("unit 1 written out of order (next is 0 of 3)"));
    s = (*writer)->WriteUnit(0, units[1]);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("the model needs"));
    ASSERT_TRUE((*writer)->WriteUnit(0, units[0]).ok());
    s = (*writer)->Commit();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("commit after 1 of 3 units")));
  }
  // Dropped uncommitted: nothing is left, not even the temporary file.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  auto clash = ModelFileWriter::Begin(path, spec, {{"weft.job_spec", "x"}});
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(clash.status().message(), HasSubstr("weft.job_spec"));
  weft::v1::JobSpec bad = spec;
  bad.mutable_model()->set_num_kv_heads(3);
  EXPECT_EQ(ModelFileWriter::Begin(path, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelFileWriter::Begin(dir.File("no/such/dir/m.safetensors"), spec).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// Extra metadata goes in next to the spec, and the file loads like SaveModel's.
TEST(ModelFileWriterTest, ExtraMetadataIsWrittenAndTheFileLoads) {
  weft::testing::TempDir dir;
  const weft::v1::JobSpec spec = TinyLlamaSpec(true);
  auto arch = engine::MakeModelArch(spec.model());
  ASSERT_TRUE(arch.ok());
  const std::vector<std::vector<float>> units = InitialUnits(**arch, 4);
  const std::string path = dir.File("model.safetensors");
  auto writer = ModelFileWriter::Begin(path, spec, {{"weft.note", "streamed"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int u = 0; u < (*arch)->NumUnits(); ++u) ASSERT_TRUE((*writer)->WriteUnit(u, units[u]).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  auto file = data::ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("weft.note"), "streamed");
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->units, units);
}

}  // namespace
}  // namespace weft::worker
