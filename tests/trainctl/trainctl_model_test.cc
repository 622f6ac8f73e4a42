// trainctl's Hugging Face model commands through the binary: `model from-hf` prints a spec a
// job can use, or names what it refuses; `model export` turns a Weft model file into a Hugging
// Face directory that imports back exactly.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/worker/hf/hf_test_util.h"
#include "worker/data/tokenizer.h"
#include "worker/hf/hf_checkpoint.h"
#include "worker/model_io/model_file.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using testing::CommandResult;
using testing::RunCommand;

CommandResult Trainctl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::BinDir() + "/trainctl"};
  argv.insert(argv.end(), args.begin(), args.end());
  // No coordinator is running: these commands must not need one.
  argv.push_back("--coordinator=127.0.0.1:1");
  return RunCommand(argv);
}

TEST(TrainctlModelTest, FromHfPrintsASpecThatParsesAndRefusesNamedKeys) {
  testing::TempDir tmp;
  const v1::ModelSpec llama = hf::testing::TinyLlama(false);
  const std::string dir = tmp.File("llama");
  hf::testing::WriteHfDir(dir, llama, hf::testing::ExactUnits(*hf::testing::ArchOf(llama), 1),
                          model_io::Dtype::kBF16);
  CommandResult r = Trainctl({"model", "from-hf", dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("architecture: LLAMA"));
  EXPECT_THAT(r.out, HasSubstr("num_kv_heads: 2"));
  EXPECT_THAT(r.out, HasSubstr("kind: LLAMA3"));
  EXPECT_THAT(r.out, HasSubstr("init_from_hf_dir: \"" + dir + "\""));
  // What it prints is a piece of a job spec: it parses as one.
  v1::JobSpec parsed;
  auto spec = ParseJobSpecText(r.out, "printed");
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << r.out;
  EXPECT_EQ(spec->model().intermediate_size(), 24);
  EXPECT_EQ(spec->init_from_hf_dir(), dir);

  // -o json: the ModelSpec as every trainctl command prints a message (docs/deploy.md): proto
  // field names, zeros included.
  r = Trainctl({"-o", "json", "model", "from-hf", dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json printed = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(printed.is_object()) << r.out;
  EXPECT_EQ(printed.value("num_kv_heads", 0), 2) << r.out;
  EXPECT_EQ(printed.value("intermediate_size", 0), 24) << r.out;
  EXPECT_TRUE(printed.contains("padded_vocab_size")) << "zeros are printed too\n" << r.out;

  std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "mlp_bias": true})";
  r = Trainctl({"model", "from-hf", dir});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(dir + "/config.json: key \"mlp_bias\" is true"));
  // A supported model_type whose weights come from another class: the field is named.
  std::ofstream(dir + "/config.json")
      << R"({"model_type": "llama", "architectures": ["Qwen2ForCausalLM"]})";
  r = Trainctl({"model", "from-hf", dir});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(dir + "/config.json: key \"architectures\" is "
                                     "[\"Qwen2ForCausalLM\"]: for model_type \"llama\" Weft "
                                     "implements LlamaForCausalLM"));
  r = Trainctl({"model", "from-hf", tmp.File("nothing")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(tmp.File("nothing")));
}

TEST(TrainctlModelTest, ExportOfAModelFileImportsBackExactly) {
  testing::TempDir tmp;
  v1::JobSpec job;
  *job.mutable_model() = hf::testing::TinyGpt2();
  const auto arch = hf::testing::ArchOf(job.model());
  const auto units = hf::testing::ExactUnits(*arch, 4);
  const std::string file = tmp.File("model.safetensors");
  ASSERT_TRUE(model_io::SaveModel(file, job, units).ok());
  const std::string out = tmp.File("hf");
  CommandResult r = Trainctl({"model", "export", file, "--out", out, "--dtype", "bf16",
                              "--max-shard-bytes", "4000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(out));
  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json"));
  auto importer = hf::HfImporter::Open(out, job.model());
  ASSERT_TRUE(importer.ok()) << importer.status();
  for (int u = 0; u < arch->NumUnits(); ++u) {
    std::vector<float> unit(arch->UnitSize(u));
    ASSERT_TRUE((*importer)->ReadParams(u, 0, unit.size(), unit.data()).ok());
    EXPECT_EQ(unit, units[u]) << "unit " << u;
  }
  r = Trainctl({"model", "export", file, "--out", tmp.File("x"), "--dtype", "fp8"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--dtype"));
  EXPECT_FALSE(std::filesystem::exists(tmp.File("x")));
}

// The export carries the model file's tokenizer: transformers gets tokenizer files and the
// tokenizer's token ids, not GPT-2's defaults (eos 50256, outside this vocabulary).
TEST(TrainctlModelTest, ExportWritesTheRecordedTokenizer) {
  testing::TempDir tmp;
  data::SentencePieceTrainOptions train;
  train.vocab_size = 320;
  for (int i = 0; i < 100; ++i) {
    train.documents.push_back(absl::StrCat("The early bird catches the worm, number ", i,
                                           ". Ничто не вечно под луной.\n"));
  }
  absl::StatusOr<std::string> model = data::TrainSentencePiece(train);
  ASSERT_TRUE(model.ok()) << model.status();
  auto tokenizer = data::LoadSentencePieceFromBytes(*model, "trained");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  v1::JobSpec job;
  *job.mutable_model() = hf::testing::TinyGpt2();
  job.mutable_model()->set_vocab_size(320);
  job.mutable_model()->set_padded_vocab_size(320);
  const auto arch = hf::testing::ArchOf(job.model());
  const std::string file = tmp.File("model.safetensors");
  ASSERT_TRUE(
      model_io::SaveModel(file, job, hf::testing::ExactUnits(*arch, 5), tokenizer->get()).ok());
  const std::string out = tmp.File("hf");
  CommandResult r = Trainctl({"-o", "json", "model", "export", file, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokenizer"], "sentencepiece");
  const nlohmann::json config = nlohmann::json::parse(testing::ReadFile(out + "/config.json"));
  EXPECT_EQ(config["bos_token_id"], 1);
  EXPECT_EQ(config["eos_token_id"], 2);
  EXPECT_TRUE(config["pad_token_id"].is_null());
  const nlohmann::json generation =
      nlohmann::json::parse(testing::ReadFile(out + "/generation_config.json"));
  EXPECT_EQ(generation["eos_token_id"], 2);
  const nlohmann::json tok = nlohmann::json::parse(testing::ReadFile(out + "/tokenizer.json"));
  EXPECT_EQ(tok["model"]["type"], "BPE");  // train-tokenizer's default type
  EXPECT_EQ(tok["model"]["vocab"].size(), 320u);
  EXPECT_EQ(tok["model"]["vocab"]["</s>"], 2);
  const nlohmann::json tok_config =
      nlohmann::json::parse(testing::ReadFile(out + "/tokenizer_config.json"));
  EXPECT_EQ(tok_config["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(tok_config["eos_token"], "</s>");
  EXPECT_TRUE(std::filesystem::exists(out + "/special_tokens_map.json"));

  // A model file without a tokenizer: ids null, no tokenizer files, and a warning says so.
  const std::string bare = tmp.File("bare.safetensors");
  ASSERT_TRUE(model_io::SaveModel(bare, job, hf::testing::ExactUnits(*arch, 5)).ok());
  r = Trainctl({"model", "export", bare, "--out", tmp.File("bare")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("records no tokenizer"));
  EXPECT_FALSE(std::filesystem::exists(tmp.File("bare/tokenizer.json")));
  EXPECT_TRUE(nlohmann::json::parse(testing::ReadFile(tmp.File("bare/config.json")))
                  ["eos_token_id"]
                      .is_null());
}

TEST(TrainctlModelTest, LogitsPrintsTheModelsRowsAndNamesBadTokens) {
  testing::TempDir tmp;
  v1::JobSpec job;
  *job.mutable_model() = hf::testing::TinyLlama(false);
  const auto arch = hf::testing::ArchOf(job.model());
  const std::string file = tmp.File("model.safetensors");
  ASSERT_TRUE(model_io::SaveModel(file, job, hf::testing::ExactUnits(*arch, 2)).ok());
  CommandResult r = Trainctl({"model", "logits", file, "--tokens", "3 1 4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["inputs"], nlohmann::json::parse("[[3, 1, 4]]"));
  ASSERT_EQ(j["logits"][0].size(), 3u);
  ASSERT_EQ(j["logits"][0][2].size(), static_cast<size_t>(arch->vocab_size()));
  // The same numbers as the library call (the JSON holds floats exactly).
  auto model = model_io::LoadModel(file);
  ASSERT_TRUE(model.ok()) << model.status();
  auto want = model_io::ModelLogits(*model, {3, 1, 4});
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(j["logits"][0][2][5].get<float>(), (*want)[2 * arch->vocab_size() + 5]);

  r = Trainctl({"model", "logits", file, "--tokens", "3 x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--tokens: \"x\" is not a token id"));
  r = Trainctl({"model", "logits", file, "--tokens", std::to_string(arch->vocab_size())});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--tokens: ids are in [0, "));
  r = Trainctl({"model", "logits", file, "--tokens", " "});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("between 1 and the context length"));
}

// `model diff`: identical files say so and exit 0; one changed element is named with its
// figures (table and JSON, the library's numbers) and exits 1 unless --tolerance covers it;
// models of different shapes and missing files are refused by name.
TEST(TrainctlModelTest, DiffNamesTheTensorsThatDifferAndExitsByTolerance) {
  testing::TempDir tmp;
  v1::JobSpec job;
  *job.mutable_model() = hf::testing::TinyLlama(false);
  const auto arch = hf::testing::ArchOf(job.model());
  const auto units = hf::testing::ExactUnits(*arch, 3);
  const std::string a = tmp.File("a.safetensors"), b = tmp.File("b.safetensors"),
                    c = tmp.File("c.safetensors");
  ASSERT_TRUE(model_io::SaveModel(a, job, units).ok());
  ASSERT_TRUE(model_io::SaveModel(b, job, units).ok());
  auto changed = units;
  const engine::TensorInfo tensor = arch->UnitTensors(1)[0];
  changed[1][tensor.offset + 2] += 0.25f;
  ASSERT_TRUE(model_io::SaveModel(c, job, changed).ok());

  CommandResult r = Trainctl({"model", "diff", a, b});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("identical"));

  r = Trainctl({"model", "diff", a, c});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr(tensor.name));
  EXPECT_THAT(r.out, HasSubstr("1 of "));
  EXPECT_THAT(r.err, HasSubstr("differ beyond --tolerance 0"));

  auto left = model_io::LoadModel(a), right = model_io::LoadModel(c);
  ASSERT_TRUE(left.ok() && right.ok());
  auto want = model_io::CompareModels(*left, *right);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(want->tensors.size(), 1u);
  EXPECT_NEAR(want->max_abs, 0.25, 1e-6);
  EXPECT_GT(want->relative, 0);
  EXPECT_LT(want->relative, want->max_relative);  // one tensor's change, over the whole model
  r = Trainctl({"-o", "json", "model", "diff", a, c, "--tolerance",
                absl::StrCat(want->relative * 2)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["identical"].get<bool>());
  EXPECT_TRUE(j["within_tolerance"].get<bool>());
  EXPECT_EQ(j["differing"].get<size_t>(), 1u);
  EXPECT_EQ(j["tensors"][0]["name"], tensor.name);
  EXPECT_DOUBLE_EQ(j["max_relative"].get<double>(), want->max_relative);
  EXPECT_DOUBLE_EQ(j["relative"].get<double>(), want->relative);
  r = Trainctl({"model", "diff", a, c, "--tolerance", absl::StrCat(want->relative / 2)});
  EXPECT_EQ(r.exit_code, 1);

  v1::JobSpec tied = job;
  *tied.mutable_model() = hf::testing::TinyLlama(true);
  const std::string d = tmp.File("tied.safetensors");
  ASSERT_TRUE(
      model_io::SaveModel(d, tied, hf::testing::ExactUnits(*hf::testing::ArchOf(tied.model()), 3))
          .ok());
  r = Trainctl({"model", "diff", a, d});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("are not the same model"));
  r = Trainctl({"model", "diff", a, tmp.File("missing.safetensors")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("missing.safetensors"));
  r = Trainctl({"model", "diff", a, c, "--tolerance", "-1"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--tolerance"));
}

}  // namespace
}  // namespace weft
