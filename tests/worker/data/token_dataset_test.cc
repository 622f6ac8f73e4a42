#include "worker/data/token_dataset.h"
#include <chrono>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/data/data_test_util.h"

namespace weft::data {
namespace {

using testing::Bin32File;
using testing::BinFile;
using testing::Iota;
using testing::Spec;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr auto kBytes = weft::v1::DATA_FORMAT_TEXT_BYTES;
constexpr auto kBin = weft::v1::DATA_FORMAT_UINT16_BIN;
constexpr auto kBin32 = weft::v1::DATA_FORMAT_UINT32_BIN;
constexpr int kLlama3Vocab = 128256;

class TokenDatasetTest : public testing::TempFilesTest {};

// Open refused the files: FAILED_PRECONDITION, with a message that `message` matches.
void ExpectRefused(const absl::StatusOr<std::unique_ptr<TokenDataset>>& ds,
                   const ::testing::Matcher<std::string>& message) {
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition) << ds.status();
  EXPECT_THAT(std::string(ds.status().message()), message);
}

TEST_F(TokenDatasetTest, TextBytesReadsEveryByteAsAToken) {
  const std::string path = Write("t.txt", "hello world, hello tokens");
  auto ds = TokenDataset::Open(Spec(path, kBytes, "/unused/val"), 256, 4, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 25);
  EXPECT_EQ((*ds)->Token(0), 'h');
  EXPECT_EQ((*ds)->Token(24), 's');

  const std::string text = "hello world, hello tokens";
  std::vector<int32_t> in(2 * 4), out(2 * 4);
  (*ds)->Batch(1, 0, 0, 0, 1, 2, in.data(), out.data());
  for (int b = 0; b < 2; ++b) {
    const int64_t start = (*ds)->SequenceStart(1, 0, 0, b);
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(in[b * 4 + t], text[start + t]);
      EXPECT_EQ(out[b * 4 + t], text[start + t + 1]);
    }
  }
}

TEST_F(TokenDatasetTest, Uint16BinTargetsAreInputsShiftedByOne) {
  const std::string path = Write("t.bin", BinFile(Iota(1000)));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 1000, 16, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 1000);
  std::vector<int32_t> in(8 * 16), out(8 * 16);
  (*ds)->Batch(7, 3, 1, 0, 1, 8, in.data(), out.data());
  for (int b = 0; b < 8; ++b) {
    EXPECT_EQ(in[b * 16], (*ds)->SequenceStart(7, 3, 1, b));
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(in[b * 16 + t], in[b * 16] + t);
      EXPECT_EQ(out[b * 16 + t], in[b * 16 + t] + 1);
    }
  }
}

TEST_F(TokenDatasetTest, LargeTokenValuesAreLittleEndian) {
  const std::string path = Write("t.bin", BinFile({0x1234, 0xFFFF, 0x0100, 0x00FF}));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 65536, 1, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->Token(0), 0x1234);
  EXPECT_EQ((*ds)->Token(1), 0xFFFF);
  EXPECT_EQ((*ds)->Token(2), 0x0100);
  EXPECT_EQ((*ds)->Token(3), 0x00FF);
}

TEST_F(TokenDatasetTest, BatchIsAPureFunctionOfSeedStepMicroStep) {
  const std::string path = Write("t.bin", BinFile(Iota(50000)));
  auto a = TokenDataset::Open(Spec(path, kBin, "/unused"), 50000, 32, Split::kTrain);
  auto b = TokenDataset::Open(Spec(path, kBin, "/unused"), 50000, 32, Split::kTrain);
  ASSERT_TRUE(a.ok() && b.ok());
  auto batch = [](const TokenDataset& ds, uint64_t seed, int64_t step, int micro) {
    std::vector<int32_t> in(4 * 32), out(4 * 32);
    ds.Batch(seed, step, micro, 1, 2, 4, in.data(), out.data());
    return in;
  };
  // Same inputs, separately opened datasets: same batch.
  EXPECT_EQ(batch(**a, 42, 10, 0), batch(**b, 42, 10, 0));
  // Any one input changed: a different batch.
  EXPECT_NE(batch(**a, 42, 10, 0), batch(**a, 43, 10, 0));
  EXPECT_NE(batch(**a, 42, 10, 0), batch(**a, 42, 11, 0));
  EXPECT_NE(batch(**a, 42, 10, 0), batch(**a, 42, 10, 1));
}

TEST_F(TokenDatasetTest, GlobalBatchIsTheSameForEveryWorldSize) {
  constexpr int kSeqLen = 8;
  constexpr int kPerRank = 3;
  constexpr int kWorld = 4;
  const std::string path = Write("t.bin", BinFile(Iota(60000)));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 60000, kSeqLen, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  for (int64_t step : {0, 1, 1000}) {
    for (int micro : {0, 3}) {
      std::vector<int32_t> single_in(kWorld * kPerRank * kSeqLen), single_out(single_in.size());
      (*ds)->Batch(5, step, micro, 0, 1, kWorld * kPerRank, single_in.data(), single_out.data());

      std::vector<int32_t> union_in, union_out;
      std::set<int32_t> starts;
      for (int rank = 0; rank < kWorld; ++rank) {
        std::vector<int32_t> in(kPerRank * kSeqLen), out(in.size());
        (*ds)->Batch(5, step, micro, rank, kWorld, kPerRank, in.data(), out.data());
        union_in.insert(union_in.end(), in.begin(), in.end());
        union_out.insert(union_out.end(), out.begin(), out.end());
        for (int b = 0; b < kPerRank; ++b) starts.insert(in[b * kSeqLen]);
      }
      // Ranks in order, concatenated, are exactly the single process's rows in order.
      EXPECT_EQ(union_in, single_in);
      EXPECT_EQ(union_out, single_out);
      // And no two ranks (or rows) read the same sample.
      EXPECT_EQ(starts.size(), static_cast<size_t>(kWorld * kPerRank));
    }
  }
}

TEST_F(TokenDatasetTest, EveryStartIsReachableAndNoSampleReadsPastTheEnd) {
  // 3 possible starts (0, 1, 2) for seq_len 5 in 8 tokens; the last reads the final token.
  const std::string path = Write("t.bin", BinFile(Iota(8)));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 8, 5, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  std::set<int64_t> starts;
  for (int step = 0; step < 200; ++step) {
    std::vector<int32_t> in(4 * 5), out(4 * 5);
    (*ds)->Batch(0, step, 0, 0, 1, 4, in.data(), out.data());
    for (int b = 0; b < 4; ++b) starts.insert(in[b * 5]);
    for (int32_t v : out) EXPECT_LT(v, 8);
  }
  EXPECT_EQ(starts, (std::set<int64_t>{0, 1, 2}));
}

TEST_F(TokenDatasetTest, HeldOutValidationTailNeverOverlapsTraining) {
  // 200 tokens, default val_fraction (0 -> 0.1): train = tokens [0, 180), val = [180, 200).
  const std::string path = Write("t.bin", BinFile(Iota(200)));
  auto train = TokenDataset::Open(Spec(path, kBin), 200, 16, Split::kTrain);
  auto val = TokenDataset::Open(Spec(path, kBin), 200, 16, Split::kVal);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ((*train)->num_tokens(), 180);
  EXPECT_EQ((*val)->num_tokens(), 20);
  EXPECT_EQ((*train)->first_token_index(), 0);
  EXPECT_EQ((*val)->first_token_index(), 180);

  int32_t train_min = 1 << 30, train_max = -1, val_min = 1 << 30, val_max = -1;
  for (int step = 0; step < 200; ++step) {
    std::vector<int32_t> in(16 * 16), out(16 * 16);
    (*train)->Batch(1, step, 0, 0, 1, 16, in.data(), out.data());
    for (int32_t v : in) train_min = std::min(train_min, v);
    for (int32_t v : out) train_max = std::max(train_max, v);
    (*val)->Batch(1, step, 0, 0, 1, 16, in.data(), out.data());
    for (int32_t v : in) val_min = std::min(val_min, v);
    for (int32_t v : out) val_max = std::max(val_max, v);
  }
  // Both splits are used right up to their boundary, and never past it.
  EXPECT_EQ(train_min, 0);
  EXPECT_EQ(train_max, 179);
  EXPECT_EQ(val_min, 180);
  EXPECT_EQ(val_max, 199);
}

TEST_F(TokenDatasetTest, ExplicitValFractionAndSeparateValFile) {
  const std::string train_path = Write("train.bin", BinFile(Iota(1000)));
  auto val = TokenDataset::Open(Spec(train_path, kBin, "", 0.25), 1000, 4, Split::kVal);
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ((*val)->num_tokens(), 250);
  EXPECT_EQ((*val)->Token(0), 750);

  const std::string val_path = Write("val.txt", "validation text");
  auto own_val = TokenDataset::Open(Spec(train_path, kBytes, val_path, 0.25), 256, 4, Split::kVal);
  ASSERT_TRUE(own_val.ok()) << own_val.status();
  EXPECT_EQ((*own_val)->path(), val_path);
  EXPECT_EQ((*own_val)->num_tokens(), 15);
  // With a val file, all of the train file is training data (val_fraction is ignored).
  auto own_train =
      TokenDataset::Open(Spec(train_path, kBin, val_path, 0.25), 1000, 4, Split::kTrain);
  ASSERT_TRUE(own_train.ok()) << own_train.status();
  EXPECT_EQ((*own_train)->num_tokens(), 1000);
}

// ---- Errors: each names the file and is a distinct, actionable message. ----

TEST_F(TokenDatasetTest, MissingFile) {
  const std::string path = dir_.File("nope.bin");
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 100, 4, Split::kTrain);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ds.status().message(), AllOf(HasSubstr(path), HasSubstr("does not exist")));
}

TEST_F(TokenDatasetTest, MissingValFileIsReportedForTheValSplitOnly) {
  const std::string train = Write("t.txt", "plenty of training text here");
  const std::string val = dir_.File("val-missing.txt");
  EXPECT_TRUE(TokenDataset::Open(Spec(train, kBytes, val), 256, 4, Split::kTrain).ok());
  auto ds = TokenDataset::Open(Spec(train, kBytes, val), 256, 4, Split::kVal);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ds.status().message(), HasSubstr(val));
}

TEST_F(TokenDatasetTest, EmptyFile) {
  for (auto format : {kBytes, kBin}) {
    const std::string path = Write("empty", "");
    auto ds = TokenDataset::Open(Spec(path, format, "/unused"), 256, 4, Split::kTrain);
    ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("is empty")));
  }
}

TEST_F(TokenDatasetTest, EmptyDirectoryAndSpecialFileAreRefused) {
  auto empty = TokenDataset::Open(Spec(dir_.path(), kBytes, "/unused"), 256, 4, Split::kTrain);
  ExpectRefused(empty, AllOf(HasSubstr(dir_.path()), HasSubstr("holds no regular files")));
  auto special = TokenDataset::Open(Spec("/dev/null", kBytes, "/unused"), 256, 4, Split::kTrain);
  ExpectRefused(special, AllOf(HasSubstr("/dev/null"), HasSubstr("not a regular file"),
                               HasSubstr("special file")));
}

TEST_F(TokenDatasetTest, TooShortForOneSequence) {
  const std::string path = Write("short.txt", "0123456789");  // 10 tokens
  auto ds = TokenDataset::Open(Spec(path, kBytes, "/unused"), 256, 10, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("too short"), HasSubstr("has 10 tokens"),
                          HasSubstr("needs 11")));
  // Exactly seq_len + 1 tokens is enough.
  EXPECT_TRUE(TokenDataset::Open(Spec(path, kBytes, "/unused"), 256, 9, Split::kTrain).ok());
}

TEST_F(TokenDatasetTest, BinWithZeroTokensIsTooShort) {
  const std::string path = Write("zero.bin", BinFile({}));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 256, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr("has 0 tokens"), HasSubstr("needs 5")));
}

TEST_F(TokenDatasetTest, HeldOutValidationSplitTooShort) {
  const std::string path = Write("t.txt", std::string(100, 'a'));  // val = last 10 tokens
  auto ds = TokenDataset::Open(Spec(path, kBytes), 256, 16, Split::kVal);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("validation split"),
                          HasSubstr("has 10 tokens"), HasSubstr("needs 17")));
  // The train split of the same file is long enough.
  EXPECT_TRUE(TokenDataset::Open(Spec(path, kBytes), 256, 16, Split::kTrain).ok());
}

TEST_F(TokenDatasetTest, BinHeaderTruncated) {
  const std::string path = Write("trunc.bin", BinFile({}).substr(0, 100));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 256, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("truncated"), HasSubstr("100 bytes")));
}

TEST_F(TokenDatasetTest, BinBadMagic) {
  const std::string path = Write("magic.bin", BinFile(Iota(100), /*magic=*/20240521));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 256, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("bad magic number 20240521")));
}

TEST_F(TokenDatasetTest, TextFileOpenedAsBinHasBadMagic) {
  const std::string path = Write("text.bin", std::string(4096, 'x'));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 256, 4, Split::kTrain);
  ExpectRefused(ds, HasSubstr("bad magic number"));
}

TEST_F(TokenDatasetTest, BinBadVersion) {
  const std::string path = Write("version.bin", BinFile(Iota(100), 20240520, /*version=*/2));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 256, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("unsupported"), HasSubstr("version 2")));
}

TEST_F(TokenDatasetTest, BinSizeMismatch) {
  // Header claims more tokens than the file holds (a truncated download)...
  const std::string short_path = Write("short.bin", BinFile(Iota(100), 20240520, 1, 101));
  auto a = TokenDataset::Open(Spec(short_path, kBin, "/unused"), 256, 4, Split::kTrain);
  ExpectRefused(a, AllOf(HasSubstr(short_path), HasSubstr("size mismatch"), HasSubstr("101 tokens"),
                         HasSubstr("has 200 bytes")));
  // ...fewer, and an odd trailing byte: all must match exactly.
  const std::string long_path = Write("long.bin", BinFile(Iota(100), 20240520, 1, 99));
  EXPECT_EQ(TokenDataset::Open(Spec(long_path, kBin, "/unused"), 256, 4, Split::kTrain)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  const std::string odd_path = Write("odd.bin", BinFile(Iota(100)) + "x");
  auto c = TokenDataset::Open(Spec(odd_path, kBin, "/unused"), 256, 4, Split::kTrain);
  EXPECT_THAT(c.status().message(), HasSubstr("size mismatch"));
  const std::string negative = Write("neg.bin", BinFile(Iota(100), 20240520, 1, 0xFFFFFFFF));
  auto d = TokenDataset::Open(Spec(negative, kBin, "/unused"), 256, 4, Split::kTrain);
  EXPECT_THAT(d.status().message(), HasSubstr("size mismatch"));
}

TEST_F(TokenDatasetTest, TokenOutOfVocabulary) {
  std::vector<uint16_t> tokens = Iota(100);
  tokens[57] = 50257;  // a GPT-2 token in a file opened with a small vocabulary
  const std::string path = Write("vocab.bin", BinFile(tokens));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 50257, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("token 50257"), HasSubstr("index 57"),
                          HasSubstr("model.vocab_size is 50257")));
  EXPECT_TRUE(TokenDataset::Open(Spec(path, kBin, "/unused"), 50258, 4, Split::kTrain).ok());
}

TEST_F(TokenDatasetTest, BadTokenInValidationTailFailsTheTrainSplitToo) {
  std::vector<uint16_t> tokens = Iota(100);
  tokens[99] = 100;
  const std::string path = Write("vocab.bin", BinFile(tokens));
  auto ds = TokenDataset::Open(Spec(path, kBin), 100, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr("token 100"), HasSubstr("index 99")));
}

TEST_F(TokenDatasetTest, TextBytesWithSmallVocabularyAreChecked) {
  const std::string path = Write("t.txt", std::string("abc\xC3\xA9z"));
  auto ds = TokenDataset::Open(Spec(path, kBytes, "/unused"), 128, 2, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr("token 195"), HasSubstr("index 3")));
}

// ---- DATA_FORMAT_UINT32_BIN (llm.c's Llama-3 files). ----

TEST_F(TokenDatasetTest, Uint32BinReadsIdsPastUint16) {
  // Ids past 65535, with every byte distinct so a wrong byte order or width shows.
  const std::vector<uint32_t> ids = {0x00010203, 128255, 65536, 0, 0x0001FF00, 7};
  const std::string path = Write("llama.bin", Bin32File(ids));
  auto ds = TokenDataset::Open(Spec(path, kBin32, "/unused"), 0x00020000, 1, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_tokens(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*ds)->Token(i), static_cast<int32_t>(ids[i])) << i;
}

TEST_F(TokenDatasetTest, Uint32BinTargetsAreInputsShiftedByOne) {
  // Tokens 70000 + i: every one needs the upper half of the uint32.
  std::vector<uint32_t> ids(2000);
  for (int i = 0; i < 2000; ++i) ids[i] = 70000 + i;
  const std::string path = Write("t.bin", Bin32File(ids));
  auto ds = TokenDataset::Open(Spec(path, kBin32), kLlama3Vocab, 16, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 1800);  // the default held-out 10%
  std::vector<int32_t> in(8 * 16), out(8 * 16);
  (*ds)->Batch(7, 3, 1, 0, 1, 8, in.data(), out.data());
  for (int b = 0; b < 8; ++b) {
    EXPECT_EQ(in[b * 16], 70000 + (*ds)->SequenceStart(7, 3, 1, b));
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(in[b * 16 + t], in[b * 16] + t);
      EXPECT_EQ(out[b * 16 + t], in[b * 16 + t] + 1);
    }
  }
  auto val = TokenDataset::Open(Spec(path, kBin32), kLlama3Vocab, 16, Split::kVal);
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ((*val)->Token(0), 70000 + 1800);
}

TEST_F(TokenDatasetTest, Uint32BinBadMagic) {
  const std::string path = Write("magic.bin", Bin32File({1, 2, 3, 4, 5, 6}, /*magic=*/12345));
  auto ds = TokenDataset::Open(Spec(path, kBin32, "/unused"), kLlama3Vocab, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("bad magic number 12345"),
                          HasSubstr("uint32 token file"), HasSubstr("expected 20240801")));
}

TEST_F(TokenDatasetTest, Uint16FileOpenedAsUint32IsNamed) {
  const std::string path = Write("gpt2.bin", BinFile(Iota(100)));
  auto ds = TokenDataset::Open(Spec(path, kBin32, "/unused"), kLlama3Vocab, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("magic number 20240520"),
                          HasSubstr("uint16 token file"),
                          HasSubstr("data.format is DATA_FORMAT_UINT32_BIN"),
                          HasSubstr("set data.format to DATA_FORMAT_UINT16_BIN")));
}

TEST_F(TokenDatasetTest, Uint32FileOpenedAsUint16IsNamed) {
  const std::string path = Write("llama.bin", Bin32File({1, 2, 3, 4, 5, 6}));
  auto ds = TokenDataset::Open(Spec(path, kBin, "/unused"), 50257, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("magic number 20240801"),
                          HasSubstr("uint32 token file"),
                          HasSubstr("data.format is DATA_FORMAT_UINT16_BIN"),
                          HasSubstr("set data.format to DATA_FORMAT_UINT32_BIN")));
}

TEST_F(TokenDatasetTest, Uint32BinBadVersion) {
  // The uint32 magic with the uint16 format's version.
  const std::string path =
      Write("version.bin", Bin32File({1, 2, 3, 4, 5, 6}, 20240801, /*version=*/1));
  auto ds = TokenDataset::Open(Spec(path, kBin32, "/unused"), kLlama3Vocab, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("unsupported uint32 token file"),
                          HasSubstr("version 1 (expected 7)")));
}

TEST_F(TokenDatasetTest, Uint32BinTruncated) {
  const std::string header_only = Write("trunc.bin", Bin32File({}).substr(0, 1000));
  auto a = TokenDataset::Open(Spec(header_only, kBin32, "/unused"), kLlama3Vocab, 4, Split::kTrain);
  ExpectRefused(a, AllOf(HasSubstr(header_only), HasSubstr("truncated uint32 token file"),
                         HasSubstr("1000 bytes")));
  // A download cut mid-token: 10 tokens promised, 9.5 present.
  std::vector<uint32_t> ids(10, 5);
  const std::string cut = Write("cut.bin", Bin32File(ids).substr(0, 1024 + 38));
  auto b = TokenDataset::Open(Spec(cut, kBin32, "/unused"), kLlama3Vocab, 4, Split::kTrain);
  ExpectRefused(b, AllOf(HasSubstr(cut), HasSubstr("size mismatch"), HasSubstr("10 tokens"),
                         HasSubstr("40 bytes"), HasSubstr("has 38 bytes")));
  // The uint16 count of bytes does not pass for uint32: 20 tokens' worth of uint16 is 10 here.
  const std::string half = Write("half.bin", Bin32File(ids, 20240801, 7, /*count=*/20));
  auto c = TokenDataset::Open(Spec(half, kBin32, "/unused"), kLlama3Vocab, 4, Split::kTrain);
  ExpectRefused(c, AllOf(HasSubstr("20 tokens (80 bytes"), HasSubstr("has 40 bytes")));
}

TEST_F(TokenDatasetTest, Uint32TokenOutOfVocabulary) {
  std::vector<uint32_t> ids(100, 1);
  ids[57] = kLlama3Vocab;  // one past the last Llama 3 id
  const std::string path = Write("vocab.bin", Bin32File(ids));
  auto ds = TokenDataset::Open(Spec(path, kBin32, "/unused"), kLlama3Vocab, 4, Split::kTrain);
  ExpectRefused(ds, AllOf(HasSubstr(path), HasSubstr("token 128256"), HasSubstr("index 57"),
                          HasSubstr("model.vocab_size is 128256")));
  EXPECT_TRUE(
      TokenDataset::Open(Spec(path, kBin32, "/unused"), kLlama3Vocab + 1, 4, Split::kTrain).ok());
  // An id no int32 can hold is reported as the file has it, not as a negative number.
  ids[57] = 0xFFFFFFFFu;
  const std::string huge = Write("huge.bin", Bin32File(ids));
  ExpectRefused(TokenDataset::Open(Spec(huge, kBin32, "/unused"), kLlama3Vocab, 4, Split::kTrain),
                HasSubstr("token 4294967295 at token index 57"));
}

TEST_F(TokenDatasetTest, FirstBadTokenIsFoundAcrossScanBlocks) {
  // The scan reduces blocks of 4096 tokens: bad tokens in a later block, in the partial last
  // block, and two in one block (the first is named).
  constexpr int kN = 3 * 4096 + 100;
  std::vector<uint32_t> ids(kN, 3);
  for (int bad : {kN - 1, 2 * 4096 + 17, 4096 + 5, 4096 + 4000}) {
    ids[bad] = 1000;
  }
  auto open = [&](const std::vector<uint32_t>& v) {
    return TokenDataset::Open(Spec(Write("blocks.bin", Bin32File(v)), kBin32, "/unused"), 1000,
                              4, Split::kTrain);
  };
  ExpectRefused(open(ids), HasSubstr("at token index 4101 "));
  ids[4096 + 5] = ids[4096 + 4000] = 3;
  ExpectRefused(open(ids), HasSubstr("at token index 8209 "));
  ids[2 * 4096 + 17] = 3;
  ExpectRefused(open(ids), HasSubstr("at token index 12387 "));
  ids[kN - 1] = 999;
  EXPECT_TRUE(open(ids).ok());
}

TEST_F(TokenDatasetTest, HeldOutValidationSplitNamesTheTokensIndexInTheFile) {
  // The validation split alone (as a worker that opened train first would) checks its tail and
  // names the index in the file, not in the split.
  std::vector<uint32_t> ids(1000, 2);
  ids[950] = 200000;
  const std::string path = Write("v.bin", Bin32File(ids));
  ExpectRefused(TokenDataset::Open(Spec(path, kBin32), kLlama3Vocab, 4, Split::kVal),
                AllOf(HasSubstr("token 200000"), HasSubstr("index 950 ")));
  // A bad token in the training part is the train split's to report.
  ids[950] = 2;
  ids[10] = 200000;
  const std::string train_bad = Write("t.bin", Bin32File(ids));
  EXPECT_TRUE(TokenDataset::Open(Spec(train_bad, kBin32), kLlama3Vocab, 4, Split::kVal).ok());
  ExpectRefused(TokenDataset::Open(Spec(train_bad, kBin32), kLlama3Vocab, 4, Split::kTrain),
                HasSubstr("index 10 "));
}

TEST_F(TokenDatasetTest, InvalidArguments) {
  const std::string path = Write("t.txt", "some text to read");
  auto check = [&](const weft::v1::DataSpec& spec, int vocab, int seq_len,
                   const std::string& expected) {
    auto ds = TokenDataset::Open(spec, vocab, seq_len, Split::kTrain);
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_THAT(ds.status().message(), HasSubstr(expected));
  };
  check(Spec(path, kBytes, "/unused"), 256, 0, "sequence length must be >= 1, got 0");
  check(Spec(path, kBytes, "/unused"), 0, 4, "vocab_size must be >= 1, got 0");
  check(Spec(path, weft::v1::DATA_FORMAT_UNSPECIFIED, "/unused"), 256, 4,
        "DATA_FORMAT_UNSPECIFIED");
  check(Spec("", kBytes, "/unused"), 256, 4, "data.train_path is empty");
  check(Spec(path, kBytes, "", 0.75), 256, 4, "data.val_fraction must be in [0, 0.5], got 0.75");
}

}  // namespace
}  // namespace weft::data
