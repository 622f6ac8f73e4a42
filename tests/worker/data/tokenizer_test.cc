#include "worker/data/tokenizer.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft::data {
namespace {

using ::testing::HasSubstr;

// A small corpus with repeated words (so BPE has merges to learn) and multibyte characters.
std::vector<std::string> Corpus() {
  std::vector<std::string> docs;
  const std::vector<std::string> lines = {
      "the quick brown fox jumps over the lazy dog",
      "a journey of a thousand miles begins with a single step",
      "Fortune favours the bold; the bold favour fortune.",
      "naïve café — déjà vu, smörgåsbord, façade",
      "Привет, мир! Как дела?",
      "東京は日本の首都です。",
      "she sells sea shells by the sea shore, and the shells she sells are sea shells",
      "how much wood would a woodchuck chuck if a woodchuck could chuck wood",
      "peter piper picked a peck of pickled peppers from the pepper patch",
      "every good boy does fine; all cows eat grass; many very eager men",
  };
  for (int i = 0; i < 40; ++i) {
    std::string doc;
    for (size_t j = 0; j < lines.size(); ++j) {
      absl::StrAppend(&doc, lines[(i + j) % lines.size()], " ", i, "\n");
    }
    docs.push_back(doc);
  }
  return docs;
}

SentencePieceTrainOptions SmallOptions() {
  SentencePieceTrainOptions options;
  options.vocab_size = 400;
  options.documents = Corpus();
  return options;
}

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::string> bytes = TrainSentencePiece(SmallOptions());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    model_bytes_ = new std::string(*bytes);
  }
  static void TearDownTestSuite() { delete model_bytes_; }

  std::unique_ptr<Tokenizer> Load() {
    auto tok = LoadSentencePieceFromBytes(*model_bytes_, "test model");
    EXPECT_TRUE(tok.ok()) << tok.status();
    return tok.ok() ? std::move(*tok) : nullptr;
  }

  static std::string* model_bytes_;
};
std::string* SentencePieceTest::model_bytes_ = nullptr;

TEST(Utf8Test, FindsTheFirstInvalidByte) {
  EXPECT_EQ(FindInvalidUtf8(""), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("plain ascii text, longer than eight bytes"), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("naïve 東京 😀"), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("abcdefghij\xFFxyz"), 10u);
  EXPECT_EQ(FindInvalidUtf8("ab\xC0\xAF"), 2u);          // overlong '/'
  EXPECT_EQ(FindInvalidUtf8("ab\xED\xA0\x80"), 2u);      // surrogate U+D800
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);    // past U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("ok \xE6\x9D"), 3u);         // cut off by the end
  EXPECT_EQ(FindInvalidUtf8("\x80"), 0u);                // a lone continuation byte
}

TEST(ByteTokenizerTest, BytesStayBytes) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  EXPECT_EQ(tok->kind(), "bytes");
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->eos_id(), -1);
  EXPECT_EQ(tok->fingerprint(), 0u);
  const std::string text = "h\xC3\xA9\xFF\n";  // not valid UTF-8, still bytes
  auto ids = tok->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{'h', 0xC3, 0xA9, 0xFF, '\n'}));
  EXPECT_EQ(tok->Decode(*ids), text);
  EXPECT_EQ(tok->Decode({'a', 300, 'b'}), "a\xEF\xBF\xBD" "b");
}

TEST(ByteTokenizerTest, HasNoSpecialTokensToAdd) {
  auto ids = MakeByteTokenizer()->Encode("x", {.add_eos = true});
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("no EOS"));
}

TEST_F(SentencePieceTest, Properties) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->bos_id(), kTrainedBosId);
  EXPECT_EQ(tok->eos_id(), kTrainedEosId);
  EXPECT_EQ(tok->model_bytes(), *model_bytes_);
  EXPECT_EQ(tok->fingerprint(), Crc32c(model_bytes_->data(), model_bytes_->size()));
}

TEST_F(SentencePieceTest, RoundTripsAsciiMultibyteAndUnseenText) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> texts = {
      "the quick brown fox",
      "  two leading spaces,  doubled   inside and trailing  ",
      "lines\nand\n\nblank lines\n",
      "tabs\tand\r\ncarriage returns",
      "naïve café déjà vu",
      "Привет, мир!",
      "東京は日本の首都です。",
      // Characters never seen in training: spelled with byte pieces.
      "emoji 😀🎉 and ☃ and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and ꙮ",
      "<s> and </s> are only text",
      "",
  };
  for (const std::string& text : texts) {
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok()) << text << ": " << ids.status();
    EXPECT_THAT(*ids, ::testing::Each(::testing::Lt(tok->vocab_size())));
    EXPECT_EQ(tok->Decode(*ids), text);
  }
}

TEST_F(SentencePieceTest, LearnsMergesSoKnownTextIsShorterThanBytes) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  const std::string text = "the quick brown fox jumps over the lazy dog";
  auto ids = tok->Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_LT(ids->size() * 3, text.size() * 2);
}

TEST_F(SentencePieceTest, SpecialTokensOnlyWhenAsked) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  auto plain = tok->Encode("<s>hello</s>");
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(*plain, ::testing::Not(::testing::Contains(tok->bos_id())));
  EXPECT_THAT(*plain, ::testing::Not(::testing::Contains(tok->eos_id())));

  auto both = tok->Encode("hello", {.add_bos = true, .add_eos = true});
  ASSERT_TRUE(both.ok());
  ASSERT_GE(both->size(), 3u);
  EXPECT_EQ(both->front(), tok->bos_id());
  EXPECT_EQ(both->back(), tok->eos_id());
  // BOS/EOS decode to nothing.
  EXPECT_EQ(tok->Decode(*both), "hello");
  std::vector<int32_t> two_docs = *tok->Encode("one");
  two_docs.push_back(tok->eos_id());
  const std::vector<int32_t> second = *tok->Encode("two");
  two_docs.insert(two_docs.end(), second.begin(), second.end());
  EXPECT_THAT(tok->Decode(two_docs), HasSubstr("one"));
  EXPECT_THAT(tok->Decode(two_docs), HasSubstr("two"));
}

TEST_F(SentencePieceTest, OutOfRangeIdsDecodeAsReplacementCharacter) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = *tok->Encode("ab");
  ids.push_back(tok->vocab_size());
  ids.push_back(-1);
  EXPECT_EQ(tok->Decode(ids), "ab\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_F(SentencePieceTest, InvalidUtf8IsAnErrorNamingTheOffset) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("good text \xC3(");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("invalid UTF-8 at byte offset 10"));
}

TEST_F(SentencePieceTest, LoadsFromAFile) {
  weft::testing::TempDir dir;
  const std::string path = dir.File("tok.model");
  weft::testing::WriteFile(path, *model_bytes_);
  auto tok = LoadSentencePieceFile(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->fingerprint(), Crc32c(model_bytes_->data(), model_bytes_->size()));
  EXPECT_EQ((*tok)->Decode(*(*tok)->Encode("fox")), "fox");
}

TEST(SentencePieceLoadTest, RefusesMissingEmptyAndGarbageFiles) {
  weft::testing::TempDir dir;
  auto missing = LoadSentencePieceFile(dir.File("nope.model"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.model"));

  weft::testing::WriteFile(dir.File("empty.model"), "");
  auto empty = LoadSentencePieceFile(dir.File("empty.model"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("empty.model"));

  weft::testing::WriteFile(dir.File("junk.model"), "this is not a protobuf \x01\x02\xFF");
  auto junk = LoadSentencePieceFile(dir.File("junk.model"));
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(junk.status().message(), HasSubstr("junk.model"));
}

TEST(SentencePieceTrainTest, SameTextSameModelBytes) {
  for (auto type : {SentencePieceTrainOptions::ModelType::kBpe,
                    SentencePieceTrainOptions::ModelType::kUnigram}) {
    SentencePieceTrainOptions options = SmallOptions();
    options.model_type = type;
    auto first = TrainSentencePiece(options);
    auto second = TrainSentencePiece(options);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(*first, *second);
    auto tok = LoadSentencePieceFromBytes(*first, "trained");
    ASSERT_TRUE(tok.ok()) << tok.status();
    const std::string text = "déjà vu 😀 the lazy fox\n";
    EXPECT_EQ((*tok)->Decode(*(*tok)->Encode(text)), text);
  }
  SentencePieceTrainOptions bigger = SmallOptions();
  bigger.vocab_size = 450;
  EXPECT_NE(*TrainSentencePiece(bigger), *TrainSentencePiece(SmallOptions()));
}

TEST(SentencePieceTrainTest, RefusesBadOptions) {
  SentencePieceTrainOptions options = SmallOptions();
  options.vocab_size = 100;
  auto small = TrainSentencePiece(options);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("vocab_size 100"));

  options = SmallOptions();
  options.vocab_size = 50000;  // far more pieces than this text has
  auto large = TrainSentencePiece(options);
  EXPECT_EQ(large.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(large.status().message(), HasSubstr("vocab_size 50000 is more than the training text has pieces for"));

  options = SmallOptions();
  options.documents = {"\n\n", ""};
  EXPECT_THAT(TrainSentencePiece(options).status().message(), HasSubstr("no training text"));

  options = SmallOptions();
  options.documents.push_back("bad \xFF byte");
  auto bad = TrainSentencePiece(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("document 40: invalid UTF-8 at byte offset 4"));
}

}  // namespace
}  // namespace weft::data
