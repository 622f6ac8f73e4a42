// The byte-level BPE trainer (worker/data/bpe_trainer.h): merges worked out by hand on tiny
// texts, the tie rule, the trained file read back by Weft's own tokenizer (bpe_tokenizer.h)
// round-tripping the multilingual fixture corpus, and every refusal. That the `tokenizers`
// library reads the file and gives the same ids is tests/fixtures/tokenizers/check_trained.py.
#include "worker/data/bpe_trainer.h"

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/data/bpe_tokenizer.h"

namespace weft::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using Merges = std::vector<std::pair<std::string, std::string>>;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> FixtureRecords() {
  return absl::StrSplit(
      ReadAll(std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/tokenizers/corpus.txt"), '\x1e');
}

BpeTrainResult Train(BpeTrainOptions options) {
  absl::StatusOr<BpeTrainResult> result = TrainBpeTokenizer(options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : BpeTrainResult{};
}

Merges MergesOf(const BpeTrainResult& result) {
  Merges merges;
  const Json spec = Json::parse(result.tokenizer_json);
  for (const Json& m : spec["model"]["merges"]) {
    merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return merges;
}

// "aaabdaaabac", one pre-token. Pairs: aa 4 (each of the two "aaa" holds it twice), ab 2, and
// bd, da, ba, ac once. (a, a) first; the words become aa a b d aa a b a c, where (aa, a) and
// (a, b) tie at 2 and the smaller left id wins: a (a byte, id 64) before aa (learned, 256).
// Then (aa, ab) at 2. Everything left is seen once: (a, c) (left a), then (d, aaab) (left d,
// 67, before aaab, 258), then (aaab, daaab), then the whole word.
TEST(BpeTrainerTest, LearnsTheMergesWorkedOutByHand) {
  BpeTrainOptions options;
  options.style = "gpt2";
  options.special_tokens = std::vector<std::string>{};
  options.documents = {"aaabdaaabac"};
  options.min_frequency = 1;
  options.vocab_size = 256 + 7;
  BpeTrainResult result = Train(options);
  EXPECT_THAT(MergesOf(result),
              ElementsAre(std::pair{"a", "a"}, std::pair{"a", "b"}, std::pair{"aa", "ab"},
                          std::pair{"a", "c"}, std::pair{"d", "aaab"},
                          std::pair{"aaab", "daaab"}, std::pair{"aaabdaaab", "ac"}));
  EXPECT_EQ(result.vocab_size, 256 + 7);
  const Json vocab = Json::parse(result.tokenizer_json)["model"]["vocab"];
  EXPECT_EQ(vocab["!"], 0);  // GPT-2's byte order
  EXPECT_EQ(vocab["a"], 64);
  EXPECT_EQ(vocab["aa"], 256);
  EXPECT_EQ(vocab["aaabdaaabac"], 262);

  // At the default min_frequency of 2 the pairs seen once are left alone.
  options.min_frequency = 2;
  result = Train(options);
  EXPECT_THAT(MergesOf(result),
              ElementsAre(std::pair{"a", "a"}, std::pair{"a", "b"}, std::pair{"aa", "ab"}));
  EXPECT_EQ(result.vocab_size, 256 + 3);

  // A full vocabulary stops it: room for two merges.
  options.vocab_size = 256 + 2;
  EXPECT_EQ(MergesOf(Train(options)).size(), 2u);
}

// Ties on the left token go to the smaller right id; document order and word order play no
// part; counts add up over documents. "ac" and " ab" are words (GPT-2's split keeps the
// space with the word, as "Ġ"): (a, b) and (a, c) are seen once each, b < c.
TEST(BpeTrainerTest, TiesGoToTheSmallerLeftThenRightId) {
  BpeTrainOptions options;
  options.style = "gpt2";
  options.special_tokens = std::vector<std::string>{};
  options.min_frequency = 1;
  options.vocab_size = 256 + 3;
  options.documents = {"ac ab"};
  EXPECT_THAT(MergesOf(Train(options)),
              ElementsAre(std::pair{"a", "b"}, std::pair{"a", "c"}, std::pair{"Ġ", "ab"}));
  // Counted over documents: (Ġ, a) 4 times (" ab" 3, " ac" 1), then (Ġa, b) 3; then (a, c)
  // and (Ġa, c) once each, and a's id is the smaller.
  options.documents = {"ac", " ab", "x ab ac", "y ab"};
  EXPECT_THAT(MergesOf(Train(options)),
              ElementsAre(std::pair{"Ġ", "a"}, std::pair{"Ġa", "b"}, std::pair{"a", "c"}));
}

std::vector<std::string> TrainingDocuments() {
  // English, code, numbers and other scripts, with the fixture corpus itself (emoji, CJK,
  // whitespace runs, spelled special tokens, invalid UTF-8) so that multi-byte characters
  // merge too.
  const std::vector<std::string> words = absl::StrSplit(
      "the quick brown fox jumps over the lazy dog while a training job shards its state "
      "across hosts and gathers every layer before its forward",
      ' ');
  std::vector<std::string> documents;
  for (int i = 0; i < 300; ++i) {
    std::string line;
    for (int k = 0; k < 12; ++k) absl::StrAppend(&line, words[(i * 7 + k) % words.size()], " ");
    absl::StrAppend(&line, "\ndef step_", i, "(x):\n    return x * ", i, " + ", i * 31 % 977,
                    "  # don't\n");
    absl::StrAppend(&line, "Il y a ", i, " modèles; naïve café — «", i, "» élan über\n");
    absl::StrAppend(&line, "日本語のテキスト、学習と推論。中文分词测试。한국어 문장입니다.\n");
    absl::StrAppend(&line, "Привет, мир! Ελληνικά γράμματα. 🚀🚀 👩‍👩‍👧‍👦\n");
    documents.push_back(std::move(line));
  }
  for (const std::string& r : FixtureRecords()) documents.push_back(r);
  return documents;
}

// The text a tokenizer decodes back to: invalid UTF-8 replaced, the special tokens gone (they
// decode to nothing), NFC for Qwen2.
std::string Expected(absl::string_view record, const std::string& style,
                     const std::vector<std::string>& specials) {
  const std::string text = ReplaceInvalidUtf8(record);
  std::string out, piece;
  const auto flush = [&] {
    absl::StrAppend(&out, style == "qwen2" ? NormalizeNfc(piece) : piece);
    piece.clear();
  };
  for (size_t i = 0; i < text.size();) {
    size_t longest = 0;
    for (const std::string& s : specials) {
      if (s.size() > longest && text.compare(i, s.size(), s) == 0) longest = s.size();
    }
    if (longest > 0) {
      flush();
      i += longest;
    } else {
      piece.push_back(text[i++]);
    }
  }
  flush();
  return out;
}

class TrainedStyleTest : public ::testing::TestWithParam<std::string> {};

// Weft's tokenizer reads the trained file, with the BOS and EOS of its tokenizer_config.json,
// and every record of the fixture corpus comes back from Decode(Encode(text)).
TEST_P(TrainedStyleTest, WeftsTokenizerReadsItAndRoundTripsTheFixtureCorpus) {
  const std::string style = GetParam();
  BpeTrainOptions options;
  options.style = style;
  options.vocab_size = 600;
  options.documents = TrainingDocuments();
  const BpeTrainResult result = Train(options);
  EXPECT_EQ(result.vocab_size, 600);
  const std::vector<std::string> specials = BpeStyleSpecialTokens(style);
  EXPECT_EQ(result.merges, 600 - 256 - static_cast<int>(specials.size()));
  absl::StatusOr<BpeSpecialIds> ids =
      ReadHfSpecialIds(result.tokenizer_config_json, "tokenizer_config.json",
                       result.tokenizer_json);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->bos_id, result.bos_id);
  EXPECT_EQ(ids->eos_id, result.eos_id);
  EXPECT_EQ(result.eos_id, 600 - static_cast<int>(specials.size()) +
                               (style == "llama3" ? 1 : 0));  // specials last, in order
  EXPECT_EQ(result.bos_id, style == "qwen2" ? -1 : 600 - static_cast<int>(specials.size()));
  auto tokenizer = LoadBpeTokenizerJson(result.tokenizer_json, style, *ids);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 600);

  for (const std::string& record : FixtureRecords()) {
    auto encoded = (*tokenizer)->Encode(record);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    EXPECT_EQ((*tokenizer)->Decode(*encoded), Expected(record, style, specials)) << record;
  }
  // It learned something: text it has seen takes well under a token a byte.
  const std::string seen = options.documents[0];
  auto encoded = (*tokenizer)->Encode(seen);
  ASSERT_TRUE(encoded.ok());
  EXPECT_LT(encoded->size() * 3, seen.size()) << encoded->size() << " tokens";
  // A special token's text is its id, alone.
  auto eos = (*tokenizer)->Encode(BpeStyleEos(style));
  ASSERT_TRUE(eos.ok());
  EXPECT_THAT(*eos, ElementsAre(result.eos_id));
}

INSTANTIATE_TEST_SUITE_P(Styles, TrainedStyleTest, ::testing::Values("gpt2", "llama3", "qwen2"));

TEST(BpeTrainerTest, TheFileSaysWhatItsStyleIs) {
  BpeTrainOptions options;
  options.vocab_size = 300;
  options.documents = {"some text, some more text"};
  options.style = "gpt2";
  Json gpt2 = Json::parse(Train(options).tokenizer_json);
  EXPECT_EQ(gpt2["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(gpt2["pre_tokenizer"]["use_regex"], true);
  EXPECT_TRUE(gpt2["normalizer"].is_null());
  EXPECT_EQ(gpt2["model"]["ignore_merges"], false);
  options.style = "llama3";
  Json llama3 = Json::parse(Train(options).tokenizer_json);
  EXPECT_EQ(llama3["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], kLlama3SplitPattern);
  EXPECT_EQ(llama3["pre_tokenizer"]["pretokenizers"][1]["use_regex"], false);
  EXPECT_EQ(llama3["model"]["ignore_merges"], true);
  EXPECT_EQ(llama3["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(llama3["added_tokens"][0]["content"], "<|begin_of_text|>");
  EXPECT_EQ(llama3["added_tokens"][0]["special"], true);
  options.style = "qwen2";
  Json qwen2 = Json::parse(Train(options).tokenizer_json);
  EXPECT_EQ(qwen2["normalizer"]["type"], "NFC");
  EXPECT_EQ(qwen2["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], kQwen2SplitPattern);
  EXPECT_TRUE(Json::parse(Train(options).tokenizer_config_json)["bos_token"].is_null());
}

// Counting on several threads gives the very same file.
TEST(BpeTrainerTest, TheThreadCountChangesNothing) {
  BpeTrainOptions options;
  options.vocab_size = 1000;
  options.documents = TrainingDocuments();
  options.threads = 1;
  const BpeTrainResult one = Train(options);
  options.threads = 3;
  const BpeTrainResult three = Train(options);
  EXPECT_EQ(one.tokenizer_json, three.tokenizer_json);
  EXPECT_EQ(one.words, three.words);
  EXPECT_EQ(one.pre_tokens, three.pre_tokens);
}

// Where the text is cut for counting changes nothing: one large document of everything the
// patterns treat specially (whitespace runs with and without line breaks, CRLF, Unicode
// spaces, contractions in both cases, digit runs, punctuation, combining marks for NFC, CJK,
// emoji), counted whole and in pieces cut at every safe line break.
TEST(BpeTrainerTest, CuttingTheTextForCountingChangesNothing) {
  const std::vector<std::string> fragments = {
      "a", "Bc", "\u00e9t\u00e9", "e\u0301", "1", "234", " ", "  ", "\n", "\n\n", "\r\n",
      "\t", " \n", "'s", "'T", "'ll", "!", "...", "(x)", "\u65e5\u672c", "\U0001F600",
      "\u00a0", "\u2028", "x\n", "\nY", ".\nZ", "\n z", "\u0416"};
  std::string text;
  uint64_t state = 12345;
  while (text.size() < 200000) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    text += fragments[(state >> 33) % fragments.size()];
  }
  for (const std::string style : {"gpt2", "llama3", "qwen2"}) {
    BpeTrainOptions options;
    options.style = style;
    options.vocab_size = 700;
    options.documents = {text};
    const BpeTrainResult whole = Train(options);
    EXPECT_EQ(whole.pieces, 1);
    options.chunk_bytes = 8;
    const BpeTrainResult cut = Train(options);
    EXPECT_GT(cut.pieces, 1000) << style;
    EXPECT_EQ(cut.pre_tokens, whole.pre_tokens) << style;
    EXPECT_EQ(cut.words, whole.words) << style;
    EXPECT_EQ(cut.tokenizer_json, whole.tokenizer_json) << style;
  }
}

// Special tokens are cut out of the text before counting, as encoding cuts them; and no merge
// may make a token with a special token's text ("ĠĠ" is two spaces' tokens).
TEST(BpeTrainerTest, SpecialTokensAreNeitherLearnedFromNorLearned) {
  BpeTrainOptions options;
  options.style = "gpt2";
  options.special_tokens = std::vector<std::string>{"<|sep|>", "ĠĠ"};
  options.bos_token = "";
  options.eos_token = "<|sep|>";
  options.min_frequency = 1;
  options.vocab_size = 400;
  options.documents = {"x<|sep|>y<|sep|>z  x  y  z<|sep|>"};
  const BpeTrainResult result = Train(options);
  const Json spec = Json::parse(result.tokenizer_json);
  for (const auto& [token, id] : spec["model"]["vocab"].items()) {
    EXPECT_EQ(token.find("sep"), std::string::npos) << token;
    EXPECT_NE(token, "ĠĠ");
  }
  EXPECT_EQ(result.bos_id, -1);
  EXPECT_EQ(result.eos_id, result.vocab_size - 2);
  auto tokenizer = LoadBpeTokenizerJson(result.tokenizer_json, "t", {-1, result.eos_id});
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto ids = (*tokenizer)->Encode("a  b");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*tokenizer)->Decode(*ids), "a  b");
}

TEST(BpeTrainerTest, RefusesBadOptionsNamingThem) {
  BpeTrainOptions good;
  good.vocab_size = 300;
  good.documents = {"some text"};
  ASSERT_TRUE(TrainBpeTokenizer(good).ok());
  ASSERT_TRUE(CheckBpeTrainOptions(good).ok());
  const auto refused = [&](auto change) {
    BpeTrainOptions options = good;
    change(options);
    const absl::Status check = CheckBpeTrainOptions(options);
    const absl::Status status = TrainBpeTokenizer(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    if (!options.documents.empty() && options.documents[0] != "" &&
        options.documents[0] != "<|eot_id|>") {
      EXPECT_EQ(check, status);  // the same refusal before reading any text
    }
    return std::string(status.message());
  };
  // The llama3 style has 5 special tokens: at least 261.
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.vocab_size = 260; }),
              HasSubstr("vocab_size 260: must lie in [261, 16777216]"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) {
                o.vocab_size = 257;
                o.special_tokens = std::vector<std::string>{"<a>", "<b>"};
              }),
              HasSubstr("vocab_size 257: must lie in [258,"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.vocab_size = (1 << 24) + 1; }),
              HasSubstr("vocab_size 16777217"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.style = "llama2"; }),
              HasSubstr("style \"llama2\": not one of gpt2, llama3, qwen2"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.documents.clear(); }),
              HasSubstr("documents: none"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.documents = {"", ""}; }),
              HasSubstr("no text to learn from"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.documents = {"<|eot_id|>"}; }),
              HasSubstr("nothing but special tokens"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) {
                o.special_tokens = std::vector<std::string>{"<a>", "<b>", "<a>"};
              }),
              HasSubstr("special_tokens[2] \"<a>\": given twice"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) {
                o.special_tokens = std::vector<std::string>{""};
              }),
              HasSubstr("special_tokens[0]: empty"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) {
                o.special_tokens = std::vector<std::string>{"\xFF"};
              }),
              HasSubstr("special_tokens[0]: not UTF-8"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) {
                o.special_tokens = std::vector<std::string>{"a"};
              }),
              HasSubstr("special_tokens[0] \"a\": the token of byte 97"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.eos_token = "<|endoftext|>"; }),
              HasSubstr("eos_token \"<|endoftext|>\": not one of the special tokens"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.min_frequency = 0; }),
              HasSubstr("min_frequency 0: must be at least 1"));
  EXPECT_THAT(refused([](BpeTrainOptions& o) { o.threads = -1; }),
              HasSubstr("threads -1: negative"));
}

}  // namespace
}  // namespace weft::data
