// Byte-level BPE tokenizer.json (worker/data/bpe_tokenizer.h) against Hugging Face
// `tokenizers`: the fixtures in tests/fixtures/tokenizers (make_fixtures.py there) are three
// trained tokenizers in the GPT-2, Llama 3 and Qwen2 styles and the ids the library gave for
// every record of a corpus of English, code, numbers, emoji, CJK, other scripts, combining
// characters, whitespace runs, spelled special tokens and invalid UTF-8. Weft must give the
// same ids, token for token, and decode them back to the text.
#include "worker/data/bpe_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace weft::data {
namespace {

using ::testing::HasSubstr;

std::string Fixture(const std::string& name) {
  return std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/tokenizers/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Records() {
  return absl::StrSplit(ReadAll(Fixture("corpus.txt")), '\x1e');
}

class BpeFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BpeFixtureTest, GivesTheIdsOfHuggingFaceTokenizersTokenForToken) {
  auto tokenizer = LoadBpeTokenizerFile(Fixture(GetParam() + ".tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->kind(), "tokenizer.json");
  const std::vector<std::string> records = Records();
  std::istringstream expected(ReadAll(Fixture(GetParam() + ".ids.jsonl")));
  std::string line;
  size_t r = 0, tokens = 0;
  for (; std::getline(expected, line); ++r) {
    ASSERT_LT(r, records.size());
    const std::vector<int32_t> want = nlohmann::json::parse(line).get<std::vector<int32_t>>();
    auto ids = (*tokenizer)->Encode(records[r]);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, want) << "record " << r << ": " << records[r];
    tokens += want.size();
    // Decoding gives the text back, its invalid UTF-8 as the replacement characters it
    // became, and NFC's compositions for Qwen2; special tokens decode to nothing, so records
    // that spell them are left out.
    if (records[r].find("<|") == std::string::npos && GetParam() != "qwen2") {
      EXPECT_EQ((*tokenizer)->Decode(*ids), ReplaceInvalidUtf8(records[r])) << "record " << r;
    }
  }
  EXPECT_EQ(r, records.size());
  EXPECT_GT(tokens, 500u);
}

INSTANTIATE_TEST_SUITE_P(Styles, BpeFixtureTest, ::testing::Values("gpt2", "llama3", "qwen2"));

TEST(BpeTokenizerTest, SpecialTokensEncodeFromTheirTextAndDecodeToNothing) {
  auto tokenizer = LoadBpeTokenizerFile(Fixture("qwen2.tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto ids = (*tokenizer)->Encode("<|im_start|>user<|im_end|>");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_GE(ids->size(), 3u);
  EXPECT_EQ(ids->front(), 1);  // <|im_start|>
  EXPECT_EQ(ids->back(), 2);   // <|im_end|>
  EXPECT_EQ((*tokenizer)->Decode(*ids), "user");
}

// A NUL is a character like any other, NFC or not: the text round-trips whole.
TEST(BpeTokenizerTest, TextWithANulRoundTrips) {
  for (const char* style : {"qwen2", "llama3"}) {
    auto tokenizer = LoadBpeTokenizerFile(Fixture(std::string(style) + ".tokenizer.json"));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const std::string text("a\0b caf\xC3\xA9", 9);
    auto ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ((*tokenizer)->Decode(*ids), text) << style;
  }
}

// BOS and EOS come from the tokenizer_config.json beside the file, as transformers reads them
// (a string, or an object with "content"); none without one.
TEST(BpeTokenizerTest, BosAndEosFromTheTokenizerConfigBesideIt) {
  auto plain = LoadBpeTokenizerFile(Fixture("llama3.tokenizer.json"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->bos_id(), -1);
  EXPECT_EQ((*plain)->eos_id(), -1);

  const std::string dir = ::testing::TempDir() + "/bpe-config";
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name, std::ios::binary | std::ios::trunc) << text;
  };
  write("tokenizer.json", ReadAll(Fixture("llama3.tokenizer.json")));
  write("tokenizer_config.json", R"({"bos_token": "<|begin_of_text|>",
      "eos_token": {"content": "<|end_of_text|>", "special": true}, "pad_token": null})");
  auto tok = LoadBpeTokenizerFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_id(), 0);
  EXPECT_EQ((*tok)->eos_id(), 1);
  auto ids = (*tok)->Encode("hi", EncodeOptions{.add_bos = true, .add_eos = true});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->front(), 0);
  EXPECT_EQ(ids->back(), 1);

  write("tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  auto unknown = LoadBpeTokenizerFile(dir + "/tokenizer.json");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("tokenizer_config.json: eos_token \"<|nope|>\" is not a token"));
  write("tokenizer_config.json", "{not json");
  EXPECT_EQ(LoadBpeTokenizerFile(dir + "/tokenizer.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  // Ids given with the bytes (a manifest's, a model file's) must lie in the vocabulary.
  EXPECT_EQ(LoadBpeTokenizerJson(ReadAll(Fixture("llama3.tokenizer.json")), "t", {0, 99999})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A run of a million spaces is one pre-token: it merges in O(n log n), not O(n^2) (which
// would take hours), and comes back whole.
TEST(BpeTokenizerTest, AVeryLongPreTokenMergesQuickly) {
  auto tokenizer = LoadBpeTokenizerFile(Fixture("gpt2.tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = "x" + std::string(1 << 20, ' ') + "y";
  auto ids = (*tokenizer)->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_LE(ids->size(), text.size() / 2 + 1);  // the spaces merged, two a token at least
  EXPECT_EQ((*tokenizer)->Decode(*ids), text);
}

TEST(BpeTokenizerTest, BadFilesAreRefusedNamingWhatIsWrong) {
  auto missing = LoadBpeTokenizerFile("/nonexistent/tokenizer.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  auto not_json = LoadBpeTokenizerJson("{\"model\": ", "t.json");
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_json.status().message(), HasSubstr("t.json: not JSON"));

  nlohmann::json spec = nlohmann::json::parse(ReadAll(Fixture("llama3.tokenizer.json")));
  const auto refused = [&](nlohmann::json changed) {
    return LoadBpeTokenizerJson(changed.dump(), "t.json").status();
  };
  nlohmann::json unigram = spec;
  unigram["model"]["type"] = "Unigram";
  EXPECT_THAT(refused(unigram).message(), HasSubstr("t.json: model.type: \"Unigram\", not BPE"));
  nlohmann::json lstrip = spec;
  lstrip["added_tokens"][0]["lstrip"] = true;
  EXPECT_THAT(refused(lstrip).message(), HasSubstr("added_tokens[0]: lstrip"));
  nlohmann::json nfkc = spec;
  nfkc["normalizer"] = {{"type", "NFKC"}};
  EXPECT_THAT(refused(nfkc).message(), HasSubstr("normalizer: \"NFKC\" (only NFC)"));
  nlohmann::json metaspace = spec;
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_THAT(refused(metaspace).message(), HasSubstr("pre_tokenizer[0]: \"Metaspace\""));
  nlohmann::json bad_merge = spec;
  bad_merge["model"]["merges"][0] = {"nope", "zzz"};
  EXPECT_THAT(refused(bad_merge).message(),
              HasSubstr("model.merges[0]: \"nope\" + \"zzz\": a side or the merged token"));
  nlohmann::json bad_regex = spec;
  bad_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_EQ(refused(bad_regex).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused(bad_regex).message(), HasSubstr("does not compile"));
  nlohmann::json no_bytes = spec;
  no_bytes["model"]["vocab"].erase("!");
  EXPECT_THAT(refused(no_bytes).message(), HasSubstr("no token for byte 33"));
}

}  // namespace
}  // namespace weft::data
