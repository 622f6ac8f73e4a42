// The tokenizer files of a Hugging Face export (worker/hf/hf_tokenizer.h): SentencePiece
// unigram and BPE models trained here, and bytes, written as tokenizer.json & co.; config.json's
// token ids. When python3 can import `tokenizers`, check_hf_tokenizer.py also encodes sentences
// with the written tokenizer.json and compares the ids with libsentencepiece's.
#include "worker/hf/hf_tokenizer.h"

#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/worker/hf/hf_test_util.h"
#include "worker/data/tokenizer.h"
#include "worker/hf/hf_export.h"

namespace weft::hf {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
using weft::testing::ReadFile;

constexpr char kSpace[] = "\xE2\x96\x81";
constexpr int kVocab = 350;  // trained tokenizers' pieces

std::vector<std::string> Corpus() {
  const std::vector<std::string> lines = {
      "The quick brown fox jumps over the lazy dog.",
      "A journey of a thousand miles begins with a single step.",
      "Déjà vu: the feeling you've been here before — naïve café.",
      "Привет, мир! Как дела?",
      "Whoever said nothing is impossible never tried slamming a revolving door.",
  };
  std::vector<std::string> docs;
  for (int i = 0; i < 200; ++i) {
    docs.push_back(absl::StrCat(lines[i % lines.size()], " #", i, "\n",
                                lines[(i + 2) % lines.size()], "\n"));
  }
  return docs;
}

// Sentences for the encoding checks: spaces leading, trailing and doubled, characters the
// training text never had (byte fallback), digits.
const std::vector<std::string>& Sentences() {
  static const auto* s = new std::vector<std::string>{
      "The quick brown fox jumps over the lazy dog.",
      "  two leading spaces and  a double one",
      "trailing space ",
      "Déjà vu — naïve café! 日本語 🙂",
      "Привет, мир!",
      "numbers 12345 and 3.14159",
  };
  return *s;
}

std::unique_ptr<data::Tokenizer> Train(data::SentencePieceTrainOptions::ModelType type) {
  data::SentencePieceTrainOptions options;
  options.model_type = type;
  options.vocab_size = kVocab;
  options.documents = Corpus();
  absl::StatusOr<std::string> model = data::TrainSentencePiece(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(data::LoadSentencePieceFromBytes(*model, "trained").value());
}

Json FileJson(const HfTokenizerFiles& files, const std::string& name) {
  for (const auto& [file, contents] : files.files) {
    if (file == name) return Json::parse(contents);  // throws (fails the test) if not JSON
  }
  ADD_FAILURE() << "no " << name;
  return Json();
}

// Writes the files into `dir` (created), as the export does.
void WriteFiles(const HfTokenizerFiles& files, const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const auto& [file, contents] : files.files) {
    weft::testing::WriteFile(dir + "/" + file, contents);
  }
}

// The ids of every sentence, as libsentencepiece (Weft's tokenizer) encodes it.
Json ExpectedIds(const data::Tokenizer& tokenizer) {
  Json cases = Json::array();
  for (const std::string& s : Sentences()) {
    cases.push_back({{"text", s}, {"ids", tokenizer.Encode(s).value()}});
  }
  return cases;
}

// Runs check_hf_tokenizer.py on `dir`; only says so when python3 lacks `tokenizers` (the C++
// checks stand on their own).
void CheckWithPythonTokenizers(const std::string& dir, const Json& cases) {
  weft::testing::WriteFile(dir + "/cases.json", cases.dump());
  const weft::testing::CommandResult r = weft::testing::RunCommand(
      {"/usr/bin/env", "python3", WEFT_HF_TOKENIZER_CHECK, dir, dir + "/cases.json"});
  if (r.exit_code == 77) {
    std::cout << "python check not run: " << r.out << r.err;
    return;
  }
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

class SentencePieceExportTest
    : public ::testing::TestWithParam<data::SentencePieceTrainOptions::ModelType> {};

TEST_P(SentencePieceExportTest, FilesIdsAndVocabulary) {
  const bool bpe = GetParam() == data::SentencePieceTrainOptions::ModelType::kBpe;
  const std::unique_ptr<data::Tokenizer> tokenizer = Train(GetParam());
  absl::StatusOr<HfTokenizerFiles> files = HfTokenizerFilesFor(*tokenizer, 1024);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->ids.bos_id, data::kTrainedBosId);
  EXPECT_EQ(files->ids.eos_id, data::kTrainedEosId);
  EXPECT_EQ(files->ids.pad_id, -1);

  const Json config = FileJson(*files, kHfTokenizerConfigFile);
  EXPECT_EQ(config["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(config["bos_token"], "<s>");
  EXPECT_EQ(config["eos_token"], "</s>");
  EXPECT_EQ(config["unk_token"], "<unk>");
  EXPECT_TRUE(config["pad_token"].is_null());
  EXPECT_EQ(config["model_max_length"], 1024);
  EXPECT_EQ(FileJson(*files, kHfSpecialTokensFile),
            Json::parse(R"({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})"));

  const Json t = FileJson(*files, kHfTokenizerFile);
  const Json& model = t["model"];
  ASSERT_EQ(model["type"], bpe ? "BPE" : "Unigram");
  EXPECT_EQ(model["byte_fallback"], true);
  EXPECT_TRUE(t["post_processor"].is_null());  // nothing added around the text
  // The vocabulary is SentencePiece's, in id order (and, for unigram, with its scores).
  absl::StatusOr<data::SentencePieceModelInfo> info =
      data::DescribeSentencePiece(tokenizer->model_bytes(), "trained");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->pieces.size(), static_cast<size_t>(kVocab));
  std::vector<std::string> vocab(kVocab);
  if (bpe) {
    ASSERT_EQ(model["vocab"].size(), static_cast<size_t>(kVocab));
    for (const auto& [piece, id] : model["vocab"].items()) vocab.at(id.get<int>()) = piece;
  } else {
    ASSERT_EQ(model["vocab"].size(), static_cast<size_t>(kVocab));
    EXPECT_EQ(model["unk_id"], 0);
    for (int id = 0; id < kVocab; ++id) {
      vocab[id] = model["vocab"][id][0];
      EXPECT_FLOAT_EQ(model["vocab"][id][1].get<float>(), info->pieces[id].score) << id;
    }
  }
  for (int id = 0; id < kVocab; ++id) EXPECT_EQ(vocab[id], info->pieces[id].text) << id;
  EXPECT_EQ(vocab[0], "<unk>");
  EXPECT_EQ(vocab[1], "<s>");
  EXPECT_EQ(vocab[2], "</s>");
  EXPECT_EQ(vocab[3], "<0x00>");  // byte pieces follow
  // Ids and pieces agree with libsentencepiece's own encoding: the pieces of a sentence's ids
  // spell it, spaces escaped and a space before it.
  const std::string sentence = "the quick brown fox";
  std::string spelled;
  const std::vector<int32_t> ids = tokenizer->Encode(sentence).value();
  for (int32_t id : ids) spelled += vocab[id];
  EXPECT_EQ(spelled, absl::StrCat(kSpace, absl::StrReplaceAll(sentence, {{" ", kSpace}})));
  // The special pieces are special tokens, matched before the model.
  ASSERT_EQ(t["added_tokens"].size(), 3u);
  EXPECT_EQ(t["added_tokens"][2]["content"], "</s>");
  EXPECT_EQ(t["added_tokens"][2]["id"], 2);
  EXPECT_EQ(t["added_tokens"][2]["special"], true);

  if (bpe) {
    // Every merge makes a piece of the vocabulary, each pair once, the best-scored first.
    std::set<std::pair<std::string, std::string>> seen;
    std::map<std::string, int> ids;
    for (int id = 0; id < kVocab; ++id) ids[vocab[id]] = static_cast<int>(id);
    ASSERT_GT(model["merges"].size(), 10u);
    float last = info->pieces[ids.at(model["merges"][0][0].get<std::string>() +
                                     model["merges"][0][1].get<std::string>())]
                     .score;
    for (const Json& m : model["merges"]) {
      const std::string merged = m[0].get<std::string>() + m[1].get<std::string>();
      ASSERT_TRUE(ids.count(merged)) << merged;
      EXPECT_TRUE(seen.emplace(m[0], m[1]).second);
      EXPECT_LE(info->pieces[ids[merged]].score, last);
      last = info->pieces[ids[merged]].score;
    }
  }

  const weft::testing::TempDir tmp;
  WriteFiles(*files, tmp.File("hf"));
  CheckWithPythonTokenizers(tmp.File("hf"), ExpectedIds(*tokenizer));
}

INSTANTIATE_TEST_SUITE_P(
    Types, SentencePieceExportTest,
    ::testing::Values(data::SentencePieceTrainOptions::ModelType::kUnigram,
                      data::SentencePieceTrainOptions::ModelType::kBpe),
    [](const auto& info) {
      return info.param == data::SentencePieceTrainOptions::ModelType::kBpe ? "Bpe" : "Unigram";
    });

TEST(ByteExportTest, OneTokenPerByte) {
  const std::unique_ptr<data::Tokenizer> bytes = data::MakeByteTokenizer();
  absl::StatusOr<HfTokenizerFiles> files = HfTokenizerFilesFor(*bytes, 64);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->ids.bos_id, -1);
  EXPECT_EQ(files->ids.eos_id, -1);
  const Json t = FileJson(*files, kHfTokenizerFile);
  EXPECT_EQ(t["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(t["pre_tokenizer"]["use_regex"], false);
  const Json& vocab = t["model"]["vocab"];
  ASSERT_EQ(vocab.size(), 256u);
  std::set<int> ids;
  for (const auto& [piece, id] : vocab.items()) ids.insert(id.get<int>());
  EXPECT_EQ(ids.size(), 256u);
  EXPECT_EQ(vocab["A"], 'A');
  EXPECT_EQ(vocab["\xC4\xA0"], ' ');     // U+0120 stands for the space
  EXPECT_EQ(vocab["\xC4\x80"], 0);       // U+0100 for byte 0
  EXPECT_EQ(vocab["\xC3\xBF"], 0xFF);    // ÿ for itself
  EXPECT_TRUE(FileJson(*files, kHfTokenizerConfigFile)["eos_token"].is_null());

  const weft::testing::TempDir tmp;
  WriteFiles(*files, tmp.File("hf"));
  Json cases = Json::array();
  for (const std::string& s : Sentences()) {
    cases.push_back({{"text", s}, {"ids", bytes->Encode(s).value()}});
  }
  CheckWithPythonTokenizers(tmp.File("hf"), cases);
}

// A tokenizer brought as a Hugging Face tokenizer.json goes back out as the same bytes.
TEST(TokenizerJsonExportTest, TheFileAsItCame) {
  auto json = data::LoadTokenizerFromBytes(
      "tokenizer.json",
      weft::testing::ReadFile(std::string(WEFT_SOURCE_DIR) +
                              "/tests/fixtures/tokenizers/gpt2.tokenizer.json"),
      "gpt2", /*bos_id=*/-1, /*eos_id=*/0);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<HfTokenizerFiles> files = HfTokenizerFilesFor(**json, 64);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->ids.bos_id, -1);
  EXPECT_EQ(files->ids.eos_id, 0);
  ASSERT_FALSE(files->files.empty());
  EXPECT_EQ(files->files[0].first, kHfTokenizerFile);
  EXPECT_EQ(files->files[0].second, (*json)->model_bytes());
  EXPECT_EQ(FileJson(*files, kHfTokenizerConfigFile)["tokenizer_class"],
            "PreTrainedTokenizerFast");
}

// The export's directory: config.json and generation_config.json carry the tokenizer's ids, and
// null (never transformers' GPT-2 default 50256) when there is no tokenizer.
TEST(HfExportTokenizerTest, ConfigIdsAndFiles) {
  weft::v1::ModelSpec spec = testing::TinyGpt2();
  spec.set_vocab_size(kVocab + 10);
  spec.set_padded_vocab_size(kVocab + 16);
  const auto arch = testing::ArchOf(spec);
  const auto units = testing::ExactUnits(*arch, 1);
  const weft::testing::TempDir tmp;

  HfExportOptions options;
  options.tokenizer = Train(data::SentencePieceTrainOptions::ModelType::kUnigram);
  ASSERT_TRUE(ExportHf(tmp.File("spm"), spec, units, options).ok());
  for (const char* file : {kHfTokenizerFile, kHfTokenizerConfigFile, kHfSpecialTokensFile}) {
    EXPECT_TRUE(std::filesystem::exists(tmp.File(absl::StrCat("spm/", file)))) << file;
  }
  for (const char* file : {"config.json", kHfGenerationConfigFile}) {
    const Json c = Json::parse(ReadFile(tmp.File(absl::StrCat("spm/", file))));
    EXPECT_EQ(c["bos_token_id"], 1) << file;
    EXPECT_EQ(c["eos_token_id"], 2) << file;
    EXPECT_TRUE(c["pad_token_id"].is_null()) << file;
  }

  options.tokenizer = nullptr;
  ASSERT_TRUE(ExportHf(tmp.File("none"), spec, units, options).ok());
  EXPECT_FALSE(std::filesystem::exists(tmp.File("none/tokenizer.json")));
  for (const char* file : {"config.json", kHfGenerationConfigFile}) {
    const Json c = Json::parse(ReadFile(tmp.File(absl::StrCat("none/", file))));
    ASSERT_TRUE(c.contains("eos_token_id")) << file;
    EXPECT_TRUE(c["eos_token_id"].is_null()) << file;
    EXPECT_TRUE(c["bos_token_id"].is_null()) << file;
  }

  // A tokenizer with more tokens than the model: refused, nothing written.
  spec.set_vocab_size(kVocab - 20);
  spec.set_padded_vocab_size(kVocab - 16);
  options.tokenizer = Train(data::SentencePieceTrainOptions::ModelType::kBpe);
  const absl::Status refused = ExportHf(tmp.File("small"), spec,
                                        testing::ExactUnits(*testing::ArchOf(spec), 1), options);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat(kVocab, " tokens, more than the model's vocab_size ", kVocab - 20)));
  EXPECT_FALSE(std::filesystem::exists(tmp.File("small")));
}

}  // namespace
}  // namespace weft::hf
