#include "worker/data/manifest.h"

#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/worker/data/data_test_util.h"

namespace weft::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

DatasetManifest SampleManifest() {
  DatasetManifest m;
  m.token_format = weft::v1::DATA_FORMAT_UINT16_BIN;
  m.tokenizer = {"sentencepiece", "tokenizer.model", 0x1234abcd, 4096, 1, 2};
  m.document_separator = "eos";
  m.train = {{"train-00000.bin", 100, 1024 + 200, 0xdeadbeef},
             {"train-00001.bin", 7, 1024 + 14, 0x00000001}};
  m.val = {{"val-00000.bin", 5, 1024 + 10, 0xffffffff}};
  m.train_documents = 12;
  m.val_documents = 1;
  m.sources = {{"/data/corpus/a.txt", 123456, 42}};
  m.options_json = R"({"shard_tokens":1048576,"val_fraction":0.01,"seed":0})";
  return m;
}

class ManifestTest : public testing::TempFilesTest {
 protected:
  // The sample manifest's text, as WriteManifest writes it.
  std::string SampleText() {
    EXPECT_TRUE(WriteManifest(SampleManifest(), dir_.path()).ok());
    return weft::testing::ReadFile(dir_.File(kManifestFileName));
  }

  // Writes the sample manifest with `from` replaced by `to` (which must occur) and expects
  // ReadManifest to refuse it naming `field`, and saying `what`.
  void ExpectRefused(const std::string& from, const std::string& to, const std::string& field,
                     const std::string& what) {
    const std::string text = SampleText();
    ASSERT_THAT(text, HasSubstr(from));
    Write(kManifestFileName, absl::StrReplaceAll(text, {{from, to}}));
    const auto m = ReadManifest(dir_.path());
    ASSERT_FALSE(m.ok()) << "accepted with " << from << " -> " << to;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(m.status().message(),
                AllOf(HasSubstr(dir_.File(kManifestFileName)),
                      HasSubstr(absl::StrCat("field ", field, ":")), HasSubstr(what)))
        << from << " -> " << to;
  }
};

TEST_F(ManifestTest, RoundTripKeepsEveryField) {
  ASSERT_TRUE(WriteManifest(SampleManifest(), dir_.path()).ok());
  const auto m = ReadManifest(dir_.path());
  ASSERT_TRUE(m.ok()) << m.status();
  const DatasetManifest want = SampleManifest();
  EXPECT_EQ(m->dir, dir_.path());
  EXPECT_EQ(m->token_format, want.token_format);
  EXPECT_EQ(m->tokenizer.kind, "sentencepiece");
  EXPECT_EQ(m->tokenizer.file, "tokenizer.model");
  EXPECT_EQ(m->tokenizer.crc32c, 0x1234abcdu);
  EXPECT_EQ(m->tokenizer.vocab_size, 4096);
  EXPECT_EQ(m->tokenizer.bos_id, 1);
  EXPECT_EQ(m->tokenizer.eos_id, 2);
  EXPECT_EQ(m->document_separator, "eos");
  ASSERT_EQ(m->train.size(), 2u);
  EXPECT_EQ(m->train[1].file, "train-00001.bin");
  EXPECT_EQ(m->train[1].tokens, 7);
  EXPECT_EQ(m->train[1].bytes, 1038);
  EXPECT_EQ(m->train[0].crc32c, 0xdeadbeefu);
  ASSERT_EQ(m->val.size(), 1u);
  EXPECT_EQ(m->val[0].crc32c, 0xffffffffu);
  EXPECT_EQ(m->train_documents, 12);
  EXPECT_EQ(m->val_documents, 1);
  ASSERT_EQ(m->sources.size(), 1u);
  EXPECT_EQ(m->sources[0].path, "/data/corpus/a.txt");
  EXPECT_EQ(m->sources[0].bytes, 123456);
  EXPECT_EQ(m->sources[0].documents, 42);
  EXPECT_EQ(m->options_json, want.options_json);
  EXPECT_EQ(ManifestFilePath(*m, "train-00000.bin"), dir_.File("train-00000.bin"));

  // The file path reads the same; writing what was read gives the same bytes.
  const std::string first = weft::testing::ReadFile(dir_.File(kManifestFileName));
  EXPECT_TRUE(ReadManifest(dir_.File(kManifestFileName)).ok());
  ASSERT_TRUE(WriteManifest(*m, dir_.path()).ok());
  EXPECT_EQ(weft::testing::ReadFile(dir_.File(kManifestFileName)), first);
  EXPECT_THAT(first, HasSubstr("\"crc32c\": \"0x1234abcd\""));
}

TEST_F(ManifestTest, BytesTokenizerHasNoFileAndNoSpecialTokens) {
  DatasetManifest m = SampleManifest();
  m.tokenizer = {"bytes", "", 0, 256, -1, -1};
  m.document_separator = "none";
  ASSERT_TRUE(WriteManifest(m, dir_.path()).ok());
  const std::string text = weft::testing::ReadFile(dir_.File(kManifestFileName));
  EXPECT_THAT(text, Not(HasSubstr("tokenizer.model")));
  const auto read = ReadManifest(dir_.path());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->tokenizer.kind, "bytes");
  EXPECT_EQ(read->tokenizer.vocab_size, 256);
  EXPECT_TRUE(CheckManifestTokenizer(*read).ok());
}

TEST_F(ManifestTest, MissingManifestIsNotFound) {
  const auto m = ReadManifest(dir_.path());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr(dir_.File(kManifestFileName)));
}

TEST_F(ManifestTest, NotJsonIsRefused) {
  Write(kManifestFileName, "{\"format\": ");
  const auto m = ReadManifest(dir_.path());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.status().message(), HasSubstr("not a valid JSON"));
}

TEST_F(ManifestTest, EachMalformedFieldIsNamed) {
  struct Case {
    const char* from;  // text of the sample manifest
    const char* to;    // what replaces it
    const char* field;
    const char* what;
  };
  const Case cases[] = {
      {"\"weft-dataset\"", "\"other\"", "format", "must be \"weft-dataset\""},
      {"\"version\": 1", "\"version\": 3", "version", "unsupported manifest version 3"},
      {"\"version\": 1", "\"versio\": 1", "versio", "unknown field"},
      {"\"DATA_FORMAT_UINT16_BIN\"", "\"DATA_FORMAT_TEXT_BYTES\"", "token_format", "must be"},
      {"\"sentencepiece\"", "\"bpe\"", "tokenizer.kind", "must be"},
      {"\"file\": \"tokenizer.model\",", "", "tokenizer.file", "missing"},
      {"\"tokenizer.model\"", "\"../tokenizer.model\"", "tokenizer.file", "relative"},
      {"\"0x1234abcd\"", "\"1234abcd\"", "tokenizer.crc32c", "eight lower-case hex"},
      {"\"0x1234abcd\"", "\"0x1234ABCD\"", "tokenizer.crc32c", "eight lower-case hex"},
      {"\"vocab_size\": 4096", "\"vocab_size\": 0", "tokenizer.vocab_size",
       "integer in [1, 16777216]"},
      {"\"vocab_size\": 4096", "\"vocab_size\": 70000", "token_format",
       "cannot hold tokenizer.vocab_size 70000"},
      {"\"bos_id\": 1", "\"bos_id\": 4096", "tokenizer.bos_id", "got 4096"},
      {"\"eos_id\": 2", "\"eos_id\": 2.0", "tokenizer.eos_id", "must be an integer"},
      {"\"eos_id\": 2", "\"eos_id\": -1", "document_separator", "eos_id is -1"},
      {"\"document_separator\": \"eos\"", "\"document_separator\": \"nl\"", "document_separator",
       "must be"},
      {"\"val\": [", "\"valid\": [", "splits.valid", "unknown field"},
      {"\"train-00001.bin\"", "\"/abs/train-00001.bin\"", "splits.train[1].file", "relative"},
      {"\"train-00001.bin\"", "\"train-00000.bin\"", "splits.train[1].file", "named twice"},
      {"\"val-00000.bin\"", "\"train-00000.bin\"", "splits.val[0].file", "named twice"},
      {"\"tokens\": 7", "\"tokens\": -7", "splits.train[1].tokens", "integer in [0,"},
      {"\"bytes\": 1038", "\"bytes\": 1039", "splits.train[1].bytes", "disagrees with tokens 7"},
      {"\"0xdeadbeef\"", "\"0xdeadbee\"", "splits.train[0].crc32c", "hex"},
      {"\"tokens\": 5,", "", "splits.val[0].tokens", "missing"},
      {"\"documents\": {", "\"documents\": {\"test\": 1, ", "documents.test", "unknown field"},
      {"\"val\": 1", "\"val\": \"1\"", "documents.val", "must be an integer"},
      {"\"path\": \"/data/corpus/a.txt\"", "\"path\": \"\"", "sources[0].path",
       "must not be empty"},
      {"\"documents\": 42", "\"documents\": -1", "sources[0].documents", "integer"},
  };
  for (const Case& c : cases) ExpectRefused(c.from, c.to, c.field, c.what);
}

TEST_F(ManifestTest, OptionsMustBeAnObject) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(SampleText());
  j["options"] = 1;
  Write(kManifestFileName, j.dump());
  const auto m = ReadManifest(dir_.path());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.status().message(), HasSubstr("field options: must be a JSON object"));
}

TEST_F(ManifestTest, EmptyTrainSplitIsRefused) {
  DatasetManifest m = SampleManifest();
  m.train.clear();
  const absl::Status s = WriteManifest(m, dir_.path());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field splits.train: has no shards"));
}

TEST_F(ManifestTest, WriterRefusesWhatTheReaderWouldAndLeavesNoFile) {
  DatasetManifest m = SampleManifest();
  m.train[0].bytes = 5;
  const absl::Status s = WriteManifest(m, dir_.path());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field splits.train[0].bytes"));
  m = SampleManifest();
  m.options_json = "[1]";
  EXPECT_EQ(WriteManifest(m, dir_.path()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadManifest(dir_.path()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ManifestTest, WriteReplacesAnOldManifestWhole) {
  ASSERT_TRUE(WriteManifest(SampleManifest(), dir_.path()).ok());
  DatasetManifest m = SampleManifest();
  m.train.pop_back();
  ASSERT_TRUE(WriteManifest(m, dir_.path()).ok());
  const auto read = ReadManifest(dir_.path());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->train.size(), 1u);
}

TEST_F(ManifestTest, Crc32cFormatsAndParses) {
  EXPECT_EQ(FormatCrc32c(0), "0x00000000");
  EXPECT_EQ(FormatCrc32c(0xabcdef01), "0xabcdef01");
  uint32_t crc = 0;
  EXPECT_TRUE(ParseCrc32c("0x00c0ffee", &crc));
  EXPECT_EQ(crc, 0x00c0ffeeu);
  for (const char* bad : {"", "0x", "0xc0ffee", "0X00c0ffee", "0x00c0ffeg", "0x00c0ffee0"}) {
    EXPECT_FALSE(ParseCrc32c(bad, &crc)) << bad;
  }
}

TEST_F(ManifestTest, Crc32cOfFileMatchesTheBufferChecksum) {
  // Larger than one read block, so the streamed checksum is exercised.
  std::string data(3 * (1 << 20) + 17, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 9));
  const std::string path = Write("blob", data);
  const auto crc = Crc32cOfFile(path);
  ASSERT_TRUE(crc.ok()) << crc.status();
  EXPECT_EQ(*crc, Crc32c(data.data(), data.size()));
  EXPECT_EQ(Crc32cOfFile(dir_.File("absent")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ManifestTest, TokenizerFileIsCheckedAgainstItsCrc) {
  const std::string model = "not really a sentencepiece model";
  Write("tokenizer.model", model);
  DatasetManifest m = SampleManifest();
  m.dir = dir_.path();
  m.tokenizer.crc32c = Crc32c(model.data(), model.size());
  EXPECT_TRUE(CheckManifestTokenizer(m).ok());

  m.tokenizer.crc32c ^= 1;
  const absl::Status changed = CheckManifestTokenizer(m);
  EXPECT_EQ(changed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(changed.message(), AllOf(HasSubstr(dir_.File("tokenizer.model")),
                                       HasSubstr("changed after its manifest was written"),
                                       HasSubstr(FormatCrc32c(m.tokenizer.crc32c)),
                                       HasSubstr(FormatCrc32c(m.tokenizer.crc32c ^ 1))));

  m.tokenizer.file = "missing.model";
  const absl::Status missing = CheckManifestTokenizer(m);
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.message(), AllOf(HasSubstr("missing.model"), HasSubstr("missing")));
}

}  // namespace
}  // namespace weft::data
