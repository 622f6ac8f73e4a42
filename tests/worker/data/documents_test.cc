// TokenDataset with documents and loss masks: token flags files beside the shards, documents
// found after EOS separators, document masking, and PACKED windows of whole documents.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/data/data_test_util.h"
#include "worker/data/manifest.h"
#include "worker/data/token_dataset.h"
#include "worker/data/token_flags.h"

namespace weft::data {
namespace {

using testing::BinFile;
using ::testing::HasSubstr;

using Opened = absl::StatusOr<std::unique_ptr<TokenDataset>>;

// One row of a batch.
struct Row {
  std::vector<int32_t> inputs, targets, doc_starts;
};

std::vector<Row> Rows(const TokenDataset& ds, uint64_t seed, int64_t step, int micro, int rank,
                      int world, int batch) {
  const int t = ds.seq_len();
  std::vector<int32_t> in(batch * t), out(batch * t), docs(batch * t, -7);
  ds.Batch(seed, step, micro, rank, world, batch, in.data(), out.data(), docs.data());
  std::vector<Row> rows;
  for (int b = 0; b < batch; ++b) {
    rows.push_back({{in.begin() + b * t, in.begin() + (b + 1) * t},
                    {out.begin() + b * t, out.begin() + (b + 1) * t},
                    {docs.begin() + b * t, docs.begin() + (b + 1) * t}});
  }
  return rows;
}

class DocumentsTest : public testing::TempFilesTest {
 protected:
  // Token i of the stream is 10 + i (so a row names where it came from); documents have the
  // given lengths, in order, cut into shards of `shard_tokens` (the last may be shorter; a
  // document may run on into the next shard). Token i's loss flag is clear when loss(i) is
  // false. With `flags` false no flags files are written and the documents are separated by
  // EOS = 3 instead (each document's last token is the EOS: its value is replaced).
  std::string Prepared(const std::string& name, const std::vector<int>& docs, int shard_tokens,
                       bool flags = true, bool (*loss)(int64_t) = nullptr) {
    const std::string dir = dir_.File(name);
    mkdir(dir.c_str(), 0755);
    std::vector<uint16_t> tokens;
    std::vector<uint8_t> token_flags;
    for (int len : docs) {
      for (int j = 0; j < len; ++j) {
        const int64_t i = static_cast<int64_t>(tokens.size());
        tokens.push_back(static_cast<uint16_t>(10 + i));
        if (!flags && j == len - 1) tokens.back() = kEos;
        uint8_t f = (loss == nullptr || loss(i)) ? kTokenFlagLoss : 0;
        if (j == 0) f |= kTokenFlagDocStart;
        token_flags.push_back(f);
      }
    }
    DatasetManifest m;
    m.token_format = weft::v1::DATA_FORMAT_UINT16_BIN;
    const std::string model = "a tokenizer model";
    weft::testing::WriteFile(dir + "/tokenizer.model", model);
    m.tokenizer = {
        "sentencepiece", "tokenizer.model", Crc32c(model.data(), model.size()), 4000, 1, kEos};
    m.document_separator = flags ? "none" : "eos";
    for (size_t at = 0, k = 0; at < tokens.size(); at += shard_tokens, ++k) {
      const size_t n = std::min<size_t>(shard_tokens, tokens.size() - at);
      const std::vector<uint16_t> part(tokens.begin() + at, tokens.begin() + at + n);
      const std::string bytes = BinFile(part);
      ManifestShard shard{absl::StrCat("train-", k, ".bin"), static_cast<int64_t>(n),
                          static_cast<int64_t>(bytes.size()), Crc32c(bytes.data(), bytes.size())};
      weft::testing::WriteFile(dir + "/" + shard.file, bytes);
      if (flags) {
        shard.flags_file = absl::StrCat("train-", k, ".flags");
        const std::string path = dir + "/" + shard.flags_file;
        EXPECT_TRUE(
            WriteTokenFlagsFile(path, absl::MakeConstSpan(token_flags.data() + at, n)).ok());
        const std::string written = weft::testing::ReadFile(path);
        shard.flags_bytes = static_cast<int64_t>(written.size());
        shard.flags_crc32c = Crc32c(written.data(), written.size());
      }
      m.train.push_back(shard);
    }
    if (flags) {
      m.chat_template = "chatml";
      m.loss_mask = "assistant";
    }
    EXPECT_TRUE(WriteManifest(m, dir).ok());
    stream_flags_ = token_flags;
    return dir;
  }

  static weft::v1::DataSpec ManifestSpec(
      const std::string& path, bool masking,
      weft::v1::DataSpec::Sampling sampling = weft::v1::DataSpec::RANDOM_WINDOWS) {
    weft::v1::DataSpec spec;
    spec.set_manifest_path(path);
    spec.set_document_masking(masking);
    spec.set_sampling(sampling);
    return spec;
  }

  static constexpr uint16_t kEos = 3;
  std::vector<uint8_t> stream_flags_;  // of the last Prepared dataset
};

bool EveryThird(int64_t i) { return i % 3 != 0; }

// Every row, wherever it starts: a target whose token's loss flag is clear is -1, and with
// document masking so is a target that begins a document; doc_starts point at the last
// document start at or before each position (0 for the row's first, partial document).
TEST_F(DocumentsTest, RandomWindowsApplyTheFlags) {
  const std::string dir = Prepared("d", {4, 1, 7, 3, 9, 2, 6, 5, 8}, 16, true, EveryThird);
  for (const bool masking : {false, true}) {
    auto ds = TokenDataset::Open(ManifestSpec(dir, masking), 4000, 8, Split::kTrain);
    ASSERT_TRUE(ds.ok()) << ds.status();
    int masked = 0;
    for (int step = 0; step < 20; ++step) {
      for (const Row& row : Rows(**ds, 7, step, 0, 0, 1, 4)) {
        const int64_t start = row.inputs[0] - 10;
        for (int t = 0; t < 8; ++t) {
          ASSERT_EQ(row.inputs[t], 10 + start + t);
          const uint8_t f = stream_flags_[start + t + 1];
          const bool ignored =
              (f & kTokenFlagLoss) == 0 || (masking && (f & kTokenFlagDocStart) != 0);
          EXPECT_EQ(row.targets[t], ignored ? -1 : 10 + start + t + 1) << "start " << start;
          masked += ignored ? 1 : 0;
          int expected_doc = 0;
          for (int u = 1; u <= t; ++u) {
            if (stream_flags_[start + u] & kTokenFlagDocStart) expected_doc = u;
          }
          EXPECT_EQ(row.doc_starts[t], expected_doc) << "start " << start << " t " << t;
        }
      }
    }
    EXPECT_GT(masked, 0);
  }
}

// Without flags files a dataset with EOS separators has documents too: each starts after an
// EOS. Every target counts unless document masking ignores a document's first.
TEST_F(DocumentsTest, EosSeparatorsMakeDocuments) {
  const std::string dir = Prepared("d", {4, 6, 3, 7, 5, 9}, 13, /*flags=*/false);
  auto ds = TokenDataset::Open(ManifestSpec(dir, true), 4000, 6, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_FALSE((*ds)->has_flags());
  for (int step = 0; step < 10; ++step) {
    for (const Row& row : Rows(**ds, 3, step, 0, 0, 1, 2)) {
      for (int t = 0; t < 6; ++t) {
        // The target of t begins a document exactly when it follows an EOS (input t).
        if (row.inputs[t] == kEos) EXPECT_EQ(row.targets[t], -1) << "step " << step;
        if (row.inputs[t] != kEos) EXPECT_NE(row.targets[t], -1) << "step " << step;
        if (t > 0) {
          EXPECT_EQ(row.doc_starts[t], row.inputs[t - 1] == kEos ? t : row.doc_starts[t - 1]);
        }
      }
    }
  }
}

// PACKED: each epoch visits every window once; the windows hold every document whole and in
// order, first fit, and a document longer than a window is cut at a stride of seq_len; the
// rest of a window is padding (target -1, a document of its own).
TEST_F(DocumentsTest, PackedWindowsHoldWholeDocumentsOncePerEpoch) {
  const std::vector<int> docs = {3, 4, 2, 9, 1, 5, 20, 6, 2, 2, 7};
  const std::string dir = Prepared("d", docs, 11);
  const int t = 8;  // windows of 9 tokens
  auto ds = TokenDataset::Open(ManifestSpec(dir, true, weft::v1::DataSpec::PACKED), 4000, t,
                               Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  // Documents at [0,3) [3,7) [7,9) [9,18) [18,19) [19,24) [24,44) [44,50) [50,52) [52,54)
  // [54,61): 3+4+2 fill a window; 9 alone; 1+5 (20 does not fit); 20 cut at 24, 32 (9 tokens,
  // sharing one) and its last 4 from 40; 6+2 (the next 2 does not fit); 2+7.
  const std::vector<std::pair<int64_t, int>> expected = {{0, 9},  {9, 9},  {18, 6}, {24, 9},
                                                         {32, 9}, {40, 4}, {44, 8}, {52, 9}};
  std::vector<std::pair<int64_t, int>> got;
  for (const auto& w : (*ds)->packed_windows()) got.emplace_back(w.begin, w.length);
  EXPECT_EQ(got, expected);

  // One epoch: every window exactly once, in an order the seed picks.
  const int64_t w = (*ds)->num_windows();
  ASSERT_EQ(w, 8);
  std::set<int64_t> windows;
  for (int64_t n = 0; n < w; ++n) windows.insert((*ds)->PermutedWindow(5, n));
  EXPECT_EQ(static_cast<int64_t>(windows.size()), w);

  int targets_seen = 0;
  for (int64_t n = 0; n < w; ++n) {
    std::vector<int32_t> in(t), out(t), doc(t);
    (*ds)->Batch(5, n, 0, 0, 1, 1, in.data(), out.data(), doc.data());
    const auto& win = (*ds)->packed_windows()[(*ds)->PermutedWindow(5, n)];
    for (int i = 0; i < t; ++i) {
      if (i < win.length) {
        EXPECT_EQ(in[i], 10 + win.begin + i);
      } else {
        EXPECT_EQ(out[i], -1) << "padding";
        EXPECT_EQ(doc[i], win.length) << "padding is one document";
      }
      if (i + 1 >= win.length) EXPECT_EQ(out[i], -1) << "no target past the window's tokens";
      // A target that counts is the next token (the window's extra one for the last position).
      if (i + 1 < win.length && out[i] != -1) {
        EXPECT_EQ(out[i], 10 + win.begin + i + 1) << "window " << win.begin << " position " << i;
        ++targets_seen;
      }
    }
    EXPECT_EQ(doc[0], 0);
  }
  EXPECT_GT(targets_seen, 30);  // most positions of 8 windows of 8 predict a token
}

// A batch with no target at all is a valid batch (the engine reports loss 0 for it).
TEST_F(DocumentsTest, AllMaskedIsAllMinusOne) {
  const std::string dir = Prepared("d", {10, 10}, 20, true, [](int64_t) { return false; });
  auto ds = TokenDataset::Open(ManifestSpec(dir, false), 4000, 8, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  for (const Row& row : Rows(**ds, 1, 0, 0, 0, 1, 3)) {
    EXPECT_EQ(row.targets, std::vector<int32_t>(8, -1));
  }
}

TEST_F(DocumentsTest, FlagsFileRefusals) {
  const std::string dir = Prepared("d", {10, 10}, 20);
  const std::string flags = dir + "/train-0.flags";
  const std::string good = weft::testing::ReadFile(flags);
  auto open = [&] { return TokenDataset::Open(ManifestSpec(dir, true), 4000, 8, Split::kTrain); };
  ASSERT_TRUE(open().ok()) << open().status();

  std::string changed = good;
  changed[1024 + 3] ^= kTokenFlagLoss;
  weft::testing::WriteFile(flags, changed);
  Opened ds = open();
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ds.status().message()),
              ::testing::AllOf(HasSubstr("train-0.flags"), HasSubstr("crc32c"),
                               HasSubstr("splits.train[0].flags")));

  weft::testing::WriteFile(flags, good.substr(0, good.size() - 1));
  ds = open();
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("size"));

  std::remove(flags.c_str());
  ds = open();
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("token flags file is missing"));
}

TEST(TokenFlagsTest, CheckNamesWhatIsWrong) {
  std::string file = TokenFlagsHeader(3) + std::string("\x01\x03\x00", 3);
  const auto check = [&](int64_t count) {
    return CheckTokenFlags(reinterpret_cast<const unsigned char*>(file.data()), file.size(), count,
                           "f.flags");
  };
  EXPECT_TRUE(check(3).ok());
  EXPECT_THAT(std::string(check(4).message()), HasSubstr("holds flags for 3 tokens"));
  file[1024 + 2] = 0x04;
  EXPECT_THAT(std::string(check(3).message()), HasSubstr("token 2 has unknown flag bits 0x4"));
  file[0] = 'x';
  EXPECT_THAT(std::string(check(3).message()), HasSubstr("not a token flags file"));
  EXPECT_THAT(std::string(CheckTokenFlags(reinterpret_cast<const unsigned char*>(file.data()), 10,
                                          0, "f.flags")
                              .message()),
              HasSubstr("shorter than"));
}

// Document masking and PACKED need documents; a dataset with neither flags nor an EOS
// separator has none and is refused at open, naming the setting.
TEST_F(DocumentsTest, NoDocumentsIsRefused) {
  const std::string dir = Prepared("d", {10, 10}, 20, /*flags=*/false);
  DatasetManifest m = *ReadManifest(dir);
  m.document_separator = "none";
  ASSERT_TRUE(WriteManifest(m, dir).ok());
  for (const bool packed : {false, true}) {
    Opened ds = TokenDataset::Open(
        ManifestSpec(dir, !packed,
                     packed ? weft::v1::DataSpec::PACKED : weft::v1::DataSpec::RANDOM_WINDOWS),
        4000, 8, Split::kTrain);
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(ds.status().message()),
                HasSubstr(packed ? "data.sampling PACKED" : "data.document_masking"));
  }
}

}  // namespace
}  // namespace weft::data
