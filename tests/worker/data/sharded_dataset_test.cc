// TokenDataset over many files: directories, globs, prepared datasets (manifests), and
// SEQUENTIAL sampling. One-file behaviour is token_dataset_test's.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/data/data_test_util.h"
#include "worker/data/manifest.h"
#include "worker/data/random.h"
#include "worker/data/token_dataset.h"

namespace weft::data {
namespace {

using ::testing::AllOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using testing::BinFile;
using testing::Iota;
using testing::Spec;

constexpr auto kBin = weft::v1::DATA_FORMAT_UINT16_BIN;
constexpr auto kSequential = weft::v1::DataSpec::SEQUENTIAL;

using Opened = absl::StatusOr<std::unique_ptr<TokenDataset>>;

void ExpectRefused(const Opened& ds, const ::testing::Matcher<std::string>& message) {
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition) << ds.status();
  EXPECT_THAT(std::string(ds.status().message()), message);
}

// The rows of one micro-batch, each as its inputs. `runs`: every row must be one run of
// consecutive tokens (false where a random window may span two files of unrelated runs).
std::vector<std::vector<int32_t>> Rows(const TokenDataset& ds, uint64_t seed, int64_t step,
                                       int micro, int rank, int world, int batch,
                                       bool runs = true) {
  const int t = ds.seq_len();
  std::vector<int32_t> in(batch * t), out(batch * t);
  ds.Batch(seed, step, micro, rank, world, batch, in.data(), out.data());
  std::vector<std::vector<int32_t>> rows;
  for (int b = 0; b < batch; ++b) {
    // Targets are inputs shifted by one; files hold runs k * 1000 + i here.
    for (int i = 0; i < t; ++i) {
      if (i > 0) EXPECT_EQ(in[b * t + i], out[b * t + i - 1]) << "row " << b;
      if (runs) EXPECT_EQ(out[b * t + i], in[b * t + i] + 1) << "row " << b;
    }
    rows.emplace_back(in.begin() + b * t, in.begin() + (b + 1) * t);
  }
  return rows;
}

class ShardedDatasetTest : public testing::TempFilesTest {
 protected:
  // A folder `name` of uint16 files: file k holds `lengths[k]` tokens k * 1000, k * 1000 + 1,
  // ... so a token names its file and its place. Files are written in reverse name order, so
  // nothing passes by accident of creation order.
  std::string ShardFolder(const std::string& name, const std::vector<int>& lengths) {
    const std::string dir = dir_.File(name);
    mkdir(dir.c_str(), 0755);
    for (int k = static_cast<int>(lengths.size()) - 1; k >= 0; --k) {
      weft::testing::WriteFile(ShardName(dir, k), BinFile(Iota(lengths[k], k * 1000)));
    }
    return dir;
  }
  static std::string ShardName(const std::string& dir, int k) {
    return absl::StrCat(dir, "/shard-", k, ".bin");
  }

  // A prepared dataset in folder `name`: train shards of `train` lengths (tokens as in
  // ShardFolder), val shards of `val` lengths (tokens 500 + ...), a sentencepiece tokenizer
  // of `tokenizer_vocab` pieces.
  std::string Prepared(const std::string& name, const std::vector<int>& train,
                       const std::vector<int>& val, int tokenizer_vocab = 4000) {
    const std::string dir = dir_.File(name);
    mkdir(dir.c_str(), 0755);
    DatasetManifest m;
    m.token_format = kBin;
    const std::string model = "a tokenizer model";
    weft::testing::WriteFile(dir + "/tokenizer.model", model);
    m.tokenizer = {"sentencepiece", "tokenizer.model", Crc32c(model.data(), model.size()),
                   tokenizer_vocab, 1, 2};
    m.document_separator = "eos";
    auto add = [&](const std::string& file, const std::vector<uint16_t>& tokens,
                   std::vector<ManifestShard>* split) {
      const std::string bytes = BinFile(tokens);
      weft::testing::WriteFile(dir + "/" + file, bytes);
      split->push_back({file, static_cast<int64_t>(tokens.size()),
                        static_cast<int64_t>(bytes.size()), Crc32c(bytes.data(), bytes.size())});
    };
    for (size_t k = 0; k < train.size(); ++k) {
      add(absl::StrCat("train-", k, ".bin"), Iota(train[k], k * 1000), &m.train);
    }
    for (size_t k = 0; k < val.size(); ++k) {
      add(absl::StrCat("val-", k, ".bin"), Iota(val[k], 500 + k * 1000), &m.val);
    }
    EXPECT_TRUE(WriteManifest(m, dir).ok());
    return dir;
  }

  static weft::v1::DataSpec ManifestSpec(const std::string& path) {
    weft::v1::DataSpec spec;
    spec.set_manifest_path(path);
    return spec;
  }
};

// ---- Directories and globs. ----

TEST_F(ShardedDatasetTest, DirectoryReadsItsRegularFilesInNameOrder) {
  const std::string dir = ShardFolder("d", {30, 40, 50});
  mkdir((dir + "/subdir").c_str(), 0755);  // skipped
  auto ds = TokenDataset::Open(Spec(dir, kBin, "/unused"), 3000, 4, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->path(), dir);
  ASSERT_EQ((*ds)->num_files(), 3);
  for (int k = 0; k < 3; ++k) EXPECT_EQ((*ds)->file(k), ShardName(dir, k));
  EXPECT_EQ((*ds)->num_tokens(), 120);
  EXPECT_EQ((*ds)->Token(0), 0);
  EXPECT_EQ((*ds)->Token(29), 29);
  EXPECT_EQ((*ds)->Token(30), 1000);
  EXPECT_EQ((*ds)->Token(70), 2000);
  EXPECT_EQ((*ds)->Token(119), 2049);
}

TEST_F(ShardedDatasetTest, GlobReadsItsMatchesInByteOrder) {
  const std::string dir = dir_.File("g");
  mkdir(dir.c_str(), 0755);
  // "train-10" sorts before "train-9" as bytes; the val file does not match.
  weft::testing::WriteFile(dir + "/train-9.bin", BinFile(Iota(20, 9000)));
  weft::testing::WriteFile(dir + "/train-10.bin", BinFile(Iota(20, 10000)));
  weft::testing::WriteFile(dir + "/val-0.bin", BinFile(Iota(20, 500)));
  auto ds = TokenDataset::Open(Spec(dir + "/train-*.bin", kBin, "/unused"), 20000, 4,
                               Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_files(), 2);
  EXPECT_THAT((*ds)->file(0), EndsWith("/train-10.bin"));
  EXPECT_EQ((*ds)->Token(0), 10000);
  EXPECT_EQ((*ds)->Token(20), 9000);

  auto none = TokenDataset::Open(Spec(dir + "/test-*.bin", kBin, "/unused"), 20000, 4,
                                 Split::kTrain);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(),
              AllOf(HasSubstr("test-*.bin"), HasSubstr("matches no file")));
}

TEST_F(ShardedDatasetTest, ValPathMayBeADirectoryToo) {
  const std::string train = ShardFolder("train", {30});
  const std::string val = ShardFolder("val", {10, 10});
  auto ds = TokenDataset::Open(Spec(train, kBin, val), 3000, 4, Split::kVal);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->path(), val);
  EXPECT_EQ((*ds)->num_tokens(), 20);
}

TEST_F(ShardedDatasetTest, NonTokenFileInADirectoryIsRefusedByName) {
  const std::string dir = ShardFolder("d", {30, 40});
  weft::testing::WriteFile(dir + "/README.txt", std::string(2000, 'x'));
  ExpectRefused(TokenDataset::Open(Spec(dir, kBin, "/unused"), 3000, 4, Split::kTrain),
                AllOf(HasSubstr(dir + "/README.txt"), HasSubstr("bad magic number")));
}

TEST_F(ShardedDatasetTest, DirectoryOfAPreparedDatasetPointsToManifestPath) {
  const std::string dir = Prepared("p", {30}, {});
  ExpectRefused(TokenDataset::Open(Spec(dir, kBin, "/unused"), 4000, 4, Split::kTrain),
                AllOf(HasSubstr(dir), HasSubstr("data.manifest_path")));
}

TEST_F(ShardedDatasetTest, BadTokenInALaterFileIsNamedByFileAndIndex) {
  const std::string dir = ShardFolder("d", {30, 40});
  std::vector<uint16_t> tokens = Iota(40, 1000);
  tokens[33] = 5000;
  weft::testing::WriteFile(ShardName(dir, 1), BinFile(tokens));
  ExpectRefused(TokenDataset::Open(Spec(dir, kBin, "/unused"), 3000, 4, Split::kTrain),
                AllOf(HasSubstr(ShardName(dir, 1)), HasSubstr("token 5000 at token index 33 ")));
}

TEST_F(ShardedDatasetTest, HeldOutTailComesFromTheEndOfTheLastFiles) {
  // 3 x 100 tokens, val_fraction 0.5: validation is the last 150 (half of file 1, all of
  // file 2), training the first 150.
  const std::string dir = ShardFolder("d", {100, 100, 100});
  auto train = TokenDataset::Open(Spec(dir, kBin, "", 0.5), 3000, 4, Split::kTrain);
  auto val = TokenDataset::Open(Spec(dir, kBin, "", 0.5), 3000, 4, Split::kVal);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ((*train)->num_tokens(), 150);
  EXPECT_EQ((*train)->num_files(), 2);
  EXPECT_EQ((*train)->Token(149), 1049);
  EXPECT_EQ((*val)->num_tokens(), 150);
  EXPECT_EQ((*val)->first_token_index(), 150);
  EXPECT_EQ((*val)->num_files(), 2);
  EXPECT_EQ((*val)->Token(0), 1050);
  EXPECT_EQ((*val)->Token(50), 2000);
  // No training window reaches a validation token, and validation windows stay in the tail.
  for (int step = 0; step < 300; ++step) {
    for (const auto& row : Rows(**train, 1, step, 0, 0, 1, 8, /*runs=*/false)) {
      EXPECT_TRUE(row.back() < 100 || (row.back() >= 1000 && row.back() < 1049)) << row.back();
    }
  }
  // A bad token in the training part is the train split's to report, not validation's.
  std::vector<uint16_t> tokens = Iota(100);
  tokens[3] = 9999;
  weft::testing::WriteFile(ShardName(dir, 0), BinFile(tokens));
  EXPECT_TRUE(TokenDataset::Open(Spec(dir, kBin, "", 0.5), 3000, 4, Split::kVal).ok());
  ExpectRefused(TokenDataset::Open(Spec(dir, kBin, "", 0.5), 3000, 4, Split::kTrain),
                HasSubstr("token 9999 at token index 3 "));
}

TEST_F(ShardedDatasetTest, RandomWindowsReadTheStreamAcrossFiles) {
  // Two files continuing one run (0..59, 60..119): a window may span them, as one file would.
  const std::string dir = dir_.File("s");
  mkdir(dir.c_str(), 0755);
  weft::testing::WriteFile(dir + "/a.bin", BinFile(Iota(60)));
  weft::testing::WriteFile(dir + "/b.bin", BinFile(Iota(60, 60)));
  auto ds = TokenDataset::Open(Spec(dir, kBin, "/unused"), 120, 8, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->sampling(), weft::v1::DataSpec::RANDOM_WINDOWS);
  bool spanned = false;
  for (int step = 0; step < 100; ++step) {
    const auto rows = Rows(**ds, 3, step, 0, 0, 1, 4);  // checks every row is consecutive
    for (int b = 0; b < 4; ++b) {
      EXPECT_EQ(rows[b][0], (*ds)->SequenceStart(3, step, 0, b));
      spanned |= rows[b][0] < 60 && rows[b][0] + 8 >= 60;
    }
  }
  EXPECT_TRUE(spanned);
}

// ---- Prepared datasets (manifests). ----

TEST_F(ShardedDatasetTest, ManifestSplitsAreItsTrainAndValShards) {
  const std::string dir = Prepared("p", {30, 40}, {20});
  for (const std::string& path : {dir, dir + "/manifest.json"}) {
    auto train = TokenDataset::Open(ManifestSpec(path), 4000, 4, Split::kTrain);
    auto val = TokenDataset::Open(ManifestSpec(path), 4000, 4, Split::kVal);
    ASSERT_TRUE(train.ok()) << train.status();
    ASSERT_TRUE(val.ok()) << val.status();
    EXPECT_EQ((*train)->path(), dir + "/manifest.json");
    EXPECT_EQ((*train)->num_tokens(), 70);
    EXPECT_EQ((*train)->Token(30), 1000);
    EXPECT_EQ((*val)->num_tokens(), 20);
    EXPECT_EQ((*val)->Token(0), 500);
  }
}

TEST_F(ShardedDatasetTest, ManifestRefusals) {
  const std::string dir = Prepared("p", {30, 40}, {20});
  const std::string shard = dir + "/train-1.bin";
  const std::string original = weft::testing::ReadFile(shard);
  auto open = [&](Split split = Split::kTrain, int vocab = 4000) {
    return TokenDataset::Open(ManifestSpec(dir), vocab, 4, split);
  };
  ASSERT_TRUE(open().ok()) << open().status();

  std::remove(shard.c_str());
  ExpectRefused(open(), AllOf(HasSubstr(shard), HasSubstr("shard is missing"),
                              HasSubstr("splits.train[1]")));

  weft::testing::WriteFile(shard, original + "xx");
  ExpectRefused(open(), AllOf(HasSubstr(shard), HasSubstr("changed after its manifest"),
                              HasSubstr("size 1106 bytes"), HasSubstr("says 1104 bytes")));

  // Same size, one token changed (still inside the vocabulary): only the checksum knows.
  std::string changed = original;
  changed[1024 + 2 * 7] ^= 1;
  weft::testing::WriteFile(shard, changed);
  const uint32_t was = Crc32c(original.data(), original.size());
  const uint32_t now = Crc32c(changed.data(), changed.size());
  ExpectRefused(open(), AllOf(HasSubstr(shard), HasSubstr("changed after its manifest"),
                              HasSubstr(absl::StrCat("crc32c ", FormatCrc32c(now))),
                              HasSubstr(absl::StrCat("says ", FormatCrc32c(was))),
                              HasSubstr("splits.train[1]")));

  // A uint32 file of the same size where the manifest says uint16: its magic names it.
  std::vector<uint32_t> wide(20, 1);
  weft::testing::WriteFile(shard, testing::Bin32File(wide));
  ExpectRefused(open(), AllOf(HasSubstr(shard), HasSubstr("marks a uint32 token file"),
                              HasSubstr("token_format of its manifest"),
                              HasSubstr("DATA_FORMAT_UINT16_BIN")));
  weft::testing::WriteFile(shard, original);
  ASSERT_TRUE(open().ok());

  ExpectRefused(open(Split::kTrain, 3999),
                AllOf(HasSubstr(dir + "/manifest.json"), HasSubstr("tokenizer.vocab_size 4000"),
                      HasSubstr("model.vocab_size 3999")));

  weft::testing::WriteFile(dir + "/tokenizer.model", "another tokenizer");
  ExpectRefused(open(), AllOf(HasSubstr("tokenizer.model"), HasSubstr("changed after")));
}

TEST_F(ShardedDatasetTest, ManifestWithoutValShardsRefusesValidation) {
  const std::string dir = Prepared("p", {30}, {});
  EXPECT_TRUE(TokenDataset::Open(ManifestSpec(dir), 4000, 4, Split::kTrain).ok());
  ExpectRefused(TokenDataset::Open(ManifestSpec(dir), 4000, 4, Split::kVal),
                AllOf(HasSubstr("splits.val is empty"), HasSubstr("val_interval_steps")));
}

TEST_F(ShardedDatasetTest, MissingManifestIsNotFound) {
  auto ds = TokenDataset::Open(ManifestSpec(dir_.File("nothing")), 4000, 4, Split::kTrain);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ShardedDatasetTest, ManifestShardTokensAreCheckedAgainstTheModel) {
  const std::string dir = Prepared("p", {30, 40}, {20});
  // Tokens 1000..1039 of train-1 are past a 1000-token model, tokenizer vocabulary aside.
  DatasetManifest m = *ReadManifest(dir);
  m.tokenizer.vocab_size = 900;
  ASSERT_TRUE(WriteManifest(m, dir).ok());
  ExpectRefused(TokenDataset::Open(ManifestSpec(dir), 1000, 4, Split::kTrain),
                AllOf(HasSubstr("train-1.bin"), HasSubstr("token 1000 at token index 0 ")));
}

// ---- SEQUENTIAL sampling. ----

TEST(KeyedPermutationTest, IsABijectionThatDependsOnTheKey) {
  for (uint64_t n : {1, 2, 3, 5, 64, 1000, 1025, 4097}) {
    const KeyedPermutation p(n, 7), q(n, 8);
    std::set<uint64_t> seen;
    int moved = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      EXPECT_LT(v, n);
      seen.insert(v);
      moved += v != q(i);
    }
    EXPECT_EQ(seen.size(), n);
    if (n >= 64) EXPECT_GT(moved, static_cast<int>(n / 2)) << n;
  }
}

class SequentialTest : public ShardedDatasetTest {
 protected:
  // Files of 23, 9, 4 and 17 tokens at seq_len 4: 5 + 2 + 0 + 4 = 11 windows (file 2 is
  // shorter than one window of 5 tokens), a prime so no batch shape divides an epoch.
  static constexpr int kSeqLen = 4;
  static constexpr int kAccum = 3;
  static constexpr int kWindows = 11;

  void SetUp() override {
    const std::string dir = ShardFolder("seq", {23, 9, 4, 17});
    weft::v1::DataSpec spec = Spec(dir, kBin, "/unused");
    spec.set_sampling(kSequential);
    auto ds = TokenDataset::Open(spec, {4000, kSeqLen, kAccum}, Split::kTrain);
    ASSERT_TRUE(ds.ok()) << ds.status();
    ds_ = std::move(*ds);
    ASSERT_EQ(ds_->num_windows(), kWindows);
  }

  // The first token of every window: file k's windows start at k * 1000 + w * seq_len.
  static std::multiset<int32_t> AllWindows() {
    std::multiset<int32_t> all;
    const int windows[] = {5, 2, 0, 4};
    for (int k = 0; k < 4; ++k) {
      for (int w = 0; w < windows[k]; ++w) all.insert(k * 1000 + w * kSeqLen);
    }
    return all;
  }

  // The first tokens of sequences [epoch * windows, (epoch + 1) * windows) of a run with
  // `world` ranks of `batch` rows, gathered from every rank's batches, in sequence order.
  std::vector<int32_t> Epoch(uint64_t seed, int world, int batch, int epoch) const {
    std::map<int64_t, int32_t> by_sequence;
    const int64_t per_step = static_cast<int64_t>(kAccum) * world * batch;
    const int64_t first = static_cast<int64_t>(epoch) * kWindows;
    for (int64_t step = first / per_step; step * per_step < first + kWindows; ++step) {
      for (int micro = 0; micro < kAccum; ++micro) {
        for (int rank = 0; rank < world; ++rank) {
          const auto rows = Rows(*ds_, seed, step, micro, rank, world, batch);
          for (int b = 0; b < batch; ++b) {
            const int64_t n = ((step * kAccum + micro) * world + rank) * batch + b;
            if (n >= first && n < first + kWindows) by_sequence[n] = rows[b][0];
          }
        }
      }
    }
    std::vector<int32_t> order;
    for (const auto& [n, start] : by_sequence) order.push_back(start);
    return order;
  }

  std::unique_ptr<TokenDataset> ds_;
};

TEST_F(SequentialTest, EveryWindowExactlyOncePerEpochAcrossRanksForAnyWorldSize) {
  for (int world : {1, 2, 3, 4}) {
    for (int epoch : {0, 1, 2}) {
      const std::vector<int32_t> order = Epoch(11, world, 2, epoch);
      ASSERT_EQ(order.size(), static_cast<size_t>(kWindows));
      EXPECT_EQ(std::multiset<int32_t>(order.begin(), order.end()), AllWindows())
          << "world " << world << " epoch " << epoch;
      // Which rank reads a sequence does not change the sequence.
      EXPECT_EQ(order, Epoch(11, 1, 2, epoch)) << "world " << world << " epoch " << epoch;
    }
  }
}

TEST_F(SequentialTest, OrderChangesWithTheEpochAndTheSeed) {
  const std::vector<int32_t> first = Epoch(11, 2, 2, 0);
  EXPECT_NE(first, Epoch(11, 2, 2, 1));
  EXPECT_NE(Epoch(11, 2, 2, 1), Epoch(11, 2, 2, 2));
  EXPECT_NE(first, Epoch(12, 2, 2, 0));
  // Not simply file order: the files' windows interleave.
  std::vector<int32_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(first, sorted);
}

TEST_F(SequentialTest, WindowsShareOneTokenAndSkipShortTails) {
  // File 0 (tokens 0..22) gives windows 0-4, 4-8, ..., 16-20; tokens 21 and 22 are never read.
  for (int64_t n = 0; n < 4 * kWindows; ++n) {
    const int64_t start = ds_->SequentialStart(5, n);
    const int32_t token = ds_->Token(start);
    if (token < 1000) EXPECT_LE(token + kSeqLen, 20);
    EXPECT_EQ(token % kSeqLen, 0);
    EXPECT_NE(token / 1000, 2);  // the 4-token file holds no window
  }
}

TEST_F(SequentialTest, ResumedRunReadsExactlyWhatTheContinuousRunRead) {
  std::vector<std::vector<std::vector<int32_t>>> continuous;
  for (int step = 0; step < 12; ++step) {
    for (int micro = 0; micro < kAccum; ++micro) {
      continuous.push_back(Rows(*ds_, 9, step, micro, 1, 2, 3));
    }
  }
  // A fresh dataset (a restarted worker) from step 7, mid-epoch.
  weft::v1::DataSpec spec = Spec(dir_.File("seq"), kBin, "/unused");
  spec.set_sampling(kSequential);
  auto resumed = TokenDataset::Open(spec, {4000, kSeqLen, kAccum}, Split::kTrain);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  for (int step = 7; step < 12; ++step) {
    for (int micro = 0; micro < kAccum; ++micro) {
      EXPECT_EQ(Rows(**resumed, 9, step, micro, 1, 2, 3), continuous[step * kAccum + micro])
          << "step " << step << " micro " << micro;
    }
  }
}

TEST_F(SequentialTest, GlobalBatchIsTheSameForOneRankOfFourBAndFourRanksOfB) {
  constexpr int kB = 2;
  for (int64_t step : {0, 1, 5}) {
    for (int micro = 0; micro < kAccum; ++micro) {
      std::vector<std::vector<int32_t>> ranks;
      for (int rank = 0; rank < 4; ++rank) {
        for (auto& row : Rows(*ds_, 4, step, micro, rank, 4, kB)) ranks.push_back(row);
      }
      EXPECT_EQ(Rows(*ds_, 4, step, micro, 0, 1, 4 * kB), ranks);
    }
  }
}

TEST_F(SequentialTest, ValidationStaysRandomWindowsAndTrainingAvoidsTheHeldOutTail) {
  // 3 x 100 tokens held out at 0.5: training has 100 + 50 tokens in two files.
  const std::string dir = ShardFolder("held", {100, 100, 100});
  weft::v1::DataSpec spec = Spec(dir, kBin, "", 0.5);
  spec.set_sampling(kSequential);
  auto train = TokenDataset::Open(spec, {4000, 8, 1}, Split::kTrain);
  auto val = TokenDataset::Open(spec, {4000, 8, 1}, Split::kVal);
  ASSERT_TRUE(train.ok() && val.ok());
  EXPECT_EQ((*train)->sampling(), kSequential);
  EXPECT_EQ((*val)->sampling(), weft::v1::DataSpec::RANDOM_WINDOWS);
  // 99 / 8 + 49 / 8 windows.
  EXPECT_EQ((*train)->num_windows(), 12 + 6);
  std::set<int32_t> starts;
  for (int step = 0; step < 18; ++step) {
    for (const auto& row : Rows(**train, 2, step, 0, 0, 1, 1)) {
      starts.insert(row[0]);
      EXPECT_LE(row.back() + 1, 1049);
    }
  }
  EXPECT_EQ(starts.size(), 18u);
}

TEST_F(SequentialTest, FilesAllShorterThanAWindowAreRefused) {
  const std::string dir = ShardFolder("short", {5, 5});
  weft::v1::DataSpec spec = Spec(dir, kBin, "/unused");
  spec.set_sampling(kSequential);
  // 10 tokens are enough for one random window of 8 + 1, but no file holds one.
  EXPECT_TRUE(TokenDataset::Open(Spec(dir, kBin, "/unused"), 4000, 8, Split::kTrain).ok());
  ExpectRefused(TokenDataset::Open(spec, 4000, 8, Split::kTrain),
                AllOf(HasSubstr(dir), HasSubstr("SEQUENTIAL"), HasSubstr("seq_len + 1 = 9")));
}

}  // namespace
}  // namespace weft::data
