#include "trainctl/data_prepare.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainctl/data_inputs.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "nlohmann/json.hpp"
#include "worker/data/chat_template.h"
#include "worker/data/manifest.h"
#include "worker/data/token_flags.h"
#include "worker/data/tokenizer.h"

namespace weft::dataprep {
namespace {

namespace fs = std::filesystem;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using weft::testing::ReadFile;
using weft::testing::WriteFile;

// Fortune-like text: `count` documents separated by "%" lines, some multibyte.
std::string Fortunes(int count, int salt = 0) {
  const std::vector<std::string> lines = {
      "The quick brown fox jumps over the lazy dog.",
      "A journey of a thousand miles begins with a single step.",
      "Déjà vu: the feeling you've been here before — naïve café.",
      "Привет, мир! Как дела?",
      "Whoever said nothing is impossible never tried slamming a revolving door.",
  };
  std::string text;
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j <= i % 3; ++j) {
      absl::StrAppend(&text, lines[(i + j + salt) % lines.size()], " #", i, "\n");
    }
    absl::StrAppend(&text, "%\n");
  }
  return text;
}

// The documents of Fortunes(count): what each "%"-separated run is.
std::vector<std::string> FortuneDocuments(const std::string& text) {
  std::vector<std::string> docs;
  for (absl::string_view part : absl::StrSplit(text, "%\n")) {
    if (!part.empty()) docs.emplace_back(part);
  }
  return docs;
}

struct Shard {
  int32_t header[256];
  std::vector<int32_t> tokens;
};

Shard ReadShard(const std::string& path) {
  const std::string bytes = ReadFile(path);
  Shard shard{};
  EXPECT_GE(bytes.size(), sizeof(shard.header)) << path;
  if (bytes.size() < sizeof(shard.header)) return shard;
  std::memcpy(shard.header, bytes.data(), sizeof(shard.header));
  const int width = shard.header[0] == 20240801 ? 4 : 2;
  for (size_t i = sizeof(shard.header); i + width <= bytes.size(); i += width) {
    uint32_t t = 0;
    std::memcpy(&t, bytes.data() + i, width);
    shard.tokens.push_back(static_cast<int32_t>(t));
  }
  return shard;
}

// All tokens of one split, in shard order.
std::vector<int32_t> SplitTokens(const data::DatasetManifest& m,
                                 const std::vector<data::ManifestShard>& split) {
  std::vector<int32_t> all;
  for (const data::ManifestShard& s : split) {
    const Shard shard = ReadShard(data::ManifestFilePath(m, s.file));
    all.insert(all.end(), shard.tokens.begin(), shard.tokens.end());
  }
  return all;
}

std::vector<std::vector<int32_t>> SplitAt(const std::vector<int32_t>& tokens, int32_t eos) {
  std::vector<std::vector<int32_t>> docs(1);
  for (int32_t t : tokens) {
    if (t == eos) {
      docs.emplace_back();
    } else {
      docs.back().push_back(t);
    }
  }
  return docs;
}

// Every file of `dir` by name, with its bytes.
std::map<std::string, std::string> DirectoryContents(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    files[entry.path().filename().string()] = ReadFile(entry.path().string());
  }
  return files;
}

class PrepareTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data::SentencePieceTrainOptions train;
    train.vocab_size = 500;
    train.documents = FortuneDocuments(Fortunes(60));
    absl::StatusOr<std::string> model = data::TrainSentencePiece(train);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = new std::string(*model);
  }
  static void TearDownTestSuite() { delete model_; }

  std::string Path(const std::string& name) const { return dir_.File(name); }

  std::string Write(const std::string& name, const std::string& contents) {
    WriteFile(Path(name), contents);
    return Path(name);
  }

  PrepareOptions Options(std::vector<std::string> inputs, const std::string& out = "out") {
    PrepareOptions o;
    o.inputs = std::move(inputs);
    o.out_dir = Path(out);
    o.tokenizer_path = Write("tok.model", *model_);
    o.doc_separator = "%";
    o.threads = 2;
    o.chunk_bytes = 256;  // many chunks, so threads really interleave
    o.val_fraction = 0.2;
    return o;
  }

  std::unique_ptr<data::Tokenizer> Tokenizer() {
    return std::move(data::LoadSentencePieceFromBytes(*model_, "tok").value());
  }

  // The failed run left nothing: no DIR, no DIR.tmp-*.
  void ExpectNothingLeft(const std::string& out = "out") {
    EXPECT_FALSE(fs::exists(Path(out)));
    for (const auto& entry : fs::directory_iterator(dir_.path())) {
      EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".tmp-")));
    }
  }

  void ExpectError(const PrepareOptions& options, absl::StatusCode code,
                   const std::string& message) {
    absl::StatusOr<PrepareResult> result = PrepareDataset(options);
    EXPECT_EQ(result.status().code(), code) << result.status();
    EXPECT_THAT(result.status().message(), HasSubstr(message));
    ExpectNothingLeft();
  }

  weft::testing::TempDir dir_;
  static std::string* model_;
};
std::string* PrepareTest::model_ = nullptr;

TEST_F(PrepareTest, ManifestShardsAndDocumentsAgree) {
  const std::string text = Fortunes(200);
  PrepareOptions options = Options({Write("a.txt", text)});
  options.shard_tokens = 1000;
  absl::StatusOr<PrepareResult> result = PrepareDataset(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->up_to_date);

  absl::StatusOr<data::DatasetManifest> m = data::ReadManifest(Path("out"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->token_format, weft::v1::DATA_FORMAT_UINT16_BIN);
  EXPECT_EQ(m->tokenizer.kind, "sentencepiece");
  EXPECT_EQ(m->tokenizer.vocab_size, 500);
  EXPECT_EQ(m->tokenizer.eos_id, data::kTrainedEosId);
  EXPECT_EQ(m->tokenizer.crc32c, Crc32c(model_->data(), model_->size()));
  EXPECT_EQ(ReadFile(data::ManifestFilePath(*m, m->tokenizer.file)), *model_);
  EXPECT_EQ(m->document_separator, "eos");
  ASSERT_GT(m->train.size(), 2u);

  // Every shard: header count = manifest tokens = tokens in the file; size and crc32c match;
  // all but the last of a split are full.
  for (const auto* split : {&m->train, &m->val}) {
    for (size_t i = 0; i < split->size(); ++i) {
      const data::ManifestShard& s = (*split)[i];
      const std::string path = data::ManifestFilePath(*m, s.file);
      const Shard shard = ReadShard(path);
      EXPECT_EQ(shard.header[0], 20240520);
      EXPECT_EQ(shard.header[1], 1);
      EXPECT_EQ(shard.header[2], s.tokens);
      EXPECT_EQ(static_cast<int64_t>(shard.tokens.size()), s.tokens);
      EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), s.bytes);
      const std::string bytes = ReadFile(path);
      EXPECT_EQ(Crc32c(bytes.data(), bytes.size()), s.crc32c);
      if (i + 1 < split->size()) {
        EXPECT_EQ(s.tokens, 1000);
      }
    }
  }

  // The train and val streams, cut at EOS, are the documents of the input in order, each in
  // exactly one split, and about val_fraction of them in val.
  auto tok = Tokenizer();
  const auto train = SplitAt(SplitTokens(*m, m->train), tok->eos_id());
  const auto val = SplitAt(SplitTokens(*m, m->val), tok->eos_id());
  EXPECT_EQ(static_cast<int64_t>(train.size()), m->train_documents);
  EXPECT_EQ(static_cast<int64_t>(val.size()), m->val_documents);
  const std::vector<std::string> docs = FortuneDocuments(text);
  ASSERT_EQ(train.size() + val.size(), docs.size());
  size_t t = 0, v = 0;
  for (const std::string& doc : docs) {
    const std::vector<int32_t> ids = tok->Encode(doc).value();
    if (t < train.size() && train[t] == ids) {
      ++t;
    } else {
      ASSERT_LT(v, val.size()) << doc;
      EXPECT_EQ(val[v], ids) << doc;
      ++v;
    }
  }
  EXPECT_EQ(t, train.size());
  EXPECT_GE(val.size(), 20u);  // 200 documents x 0.2, give or take the hash
  EXPECT_LE(val.size(), 60u);
  ASSERT_EQ(m->sources.size(), 1u);
  EXPECT_EQ(m->sources[0].path, Path("a.txt"));
  EXPECT_EQ(m->sources[0].documents, 200);
  EXPECT_EQ(result->train_tokens + result->val_tokens,
            static_cast<int64_t>(SplitTokens(*m, m->train).size() +
                                 SplitTokens(*m, m->val).size()));
}

// A Hugging Face tokenizer.json (tests/fixtures/tokenizers): the manifest says so and keeps
// the file as it came; the shards hold its ids of every document (no EOS of its own, so the
// documents are not separated).
TEST_F(PrepareTest, AHuggingFaceTokenizerJson) {
  const std::string json_path =
      std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen2.tokenizer.json";
  const std::string text = Fortunes(40);
  PrepareOptions options = Options({Write("a.txt", text)});
  options.tokenizer_path = json_path;
  absl::StatusOr<PrepareResult> result = PrepareDataset(options);
  ASSERT_TRUE(result.ok()) << result.status();
  absl::StatusOr<data::DatasetManifest> m = data::ReadManifest(Path("out"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tokenizer.kind, "tokenizer.json");
  EXPECT_EQ(m->tokenizer.file, "tokenizer.json");
  EXPECT_EQ(ReadFile(data::ManifestFilePath(*m, m->tokenizer.file)), ReadFile(json_path));
  EXPECT_EQ(m->document_separator, "none");
  auto tok = data::LoadTokenizerFile(json_path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(m->tokenizer.vocab_size, (*tok)->vocab_size());
  size_t expected = 0;
  for (const std::string& doc : FortuneDocuments(text)) {
    expected += (*tok)->Encode(doc).value().size();
  }
  EXPECT_EQ(SplitTokens(*m, m->train).size() + SplitTokens(*m, m->val).size(), expected);
}

// With the tokenizer_config.json beside it, its EOS separates the documents, as
// SentencePiece's does.
TEST_F(PrepareTest, ATokenizerJsonWithItsConfigSeparatesDocumentsWithItsEos) {
  fs::create_directories(Path("hf"));
  Write("hf/tokenizer.json",
        ReadFile(std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen2.tokenizer.json"));
  Write("hf/tokenizer_config.json", R"({"eos_token": "<|endoftext|>", "bos_token": null})");
  const std::string text = Fortunes(40);
  PrepareOptions options = Options({Write("a.txt", text)});
  options.tokenizer_path = Path("hf/tokenizer.json");
  absl::StatusOr<PrepareResult> result = PrepareDataset(options);
  ASSERT_TRUE(result.ok()) << result.status();
  absl::StatusOr<data::DatasetManifest> m = data::ReadManifest(Path("out"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tokenizer.eos_id, 0);
  EXPECT_EQ(m->tokenizer.bos_id, -1);
  EXPECT_EQ(m->document_separator, "eos");
  const auto train = SplitAt(SplitTokens(*m, m->train), 0);
  const auto val = SplitAt(SplitTokens(*m, m->val), 0);
  EXPECT_EQ(train.size() + val.size(), FortuneDocuments(text).size());
}

TEST_F(PrepareTest, SameBytesForAnyThreadCount) {
  const std::string a = Write("a.txt", Fortunes(150));
  const std::string b = Write("b.txt", Fortunes(90, 3));
  PrepareOptions one = Options({a, b}, "one");
  one.threads = 1;
  one.shard_tokens = 700;
  PrepareOptions two = one;
  two.out_dir = Path("two");
  two.threads = 2;
  PrepareOptions five = one;
  five.out_dir = Path("five");
  five.threads = 5;
  five.chunk_bytes = 1 << 20;  // one chunk: the chunking does not matter either
  for (const PrepareOptions& o : {one, two, five}) {
    ASSERT_TRUE(PrepareDataset(o).ok()) << o.out_dir;
  }
  const auto expected = DirectoryContents(one.out_dir);
  EXPECT_GT(expected.size(), 4u);
  EXPECT_EQ(DirectoryContents(two.out_dir), expected);
  EXPECT_EQ(DirectoryContents(five.out_dir), expected);
}

TEST_F(PrepareTest, ValFractionZeroAndOtherSeeds) {
  const std::string a = Write("a.txt", Fortunes(100));
  PrepareOptions none = Options({a}, "none");
  none.val_fraction = 0;
  ASSERT_TRUE(PrepareDataset(none).ok());
  auto m = data::ReadManifest(Path("none")).value();
  EXPECT_TRUE(m.val.empty());
  EXPECT_EQ(m.train_documents, 100);

  PrepareOptions seed1 = Options({a}, "seed1");
  PrepareOptions seed2 = Options({a}, "seed2");
  seed2.seed = 7;
  ASSERT_TRUE(PrepareDataset(seed1).ok());
  ASSERT_TRUE(PrepareDataset(seed2).ok());
  EXPECT_NE(ReadFile(Path("seed1/val-00000.bin")), ReadFile(Path("seed2/val-00000.bin")));
}

TEST_F(PrepareTest, JsonlFieldIsTheDocument) {
  const std::string jsonl = Write("docs.jsonl",
                                  "{\"text\": \"first document\", \"id\": 1}\n"
                                  "\n"
                                  "{\"id\": 2, \"text\": \"second\\nwith a newline é\"}\n"
                                  "{\"text\": \"\"}\n");
  PrepareOptions options = Options({jsonl});
  options.val_fraction = 0;
  ASSERT_TRUE(PrepareDataset(options).ok());
  auto m = data::ReadManifest(Path("out")).value();
  EXPECT_EQ(m.train_documents, 2);  // the empty one adds nothing
  auto tok = Tokenizer();
  const auto docs = SplitAt(SplitTokens(m, m.train), tok->eos_id());
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(tok->Decode(docs[0]), "first document");
  EXPECT_EQ(tok->Decode(docs[1]), "second\nwith a newline é");

  PrepareOptions other = Options({Write("other.jsonl", "{\"body\": \"x y z\"}\n")}, "other");
  other.jsonl_field = "body";
  other.val_fraction = 0;
  ASSERT_TRUE(PrepareDataset(other).ok());
}

TEST_F(PrepareTest, BytesAreConcatenatedAsTheyAre) {
  const std::string text = "raw \xFF bytes\n%\nsecond\n";  // not UTF-8: fine for bytes
  PrepareOptions options = Options({Write("a.bin.txt", text)});
  options.tokenizer_path.clear();
  options.val_fraction = 0;
  ASSERT_TRUE(PrepareDataset(options).ok());
  auto m = data::ReadManifest(Path("out")).value();
  EXPECT_EQ(m.tokenizer.kind, "bytes");
  EXPECT_EQ(m.tokenizer.vocab_size, 256);
  EXPECT_EQ(m.document_separator, "none");
  EXPECT_EQ(m.token_format, weft::v1::DATA_FORMAT_UINT16_BIN);
  EXPECT_FALSE(fs::exists(Path("out/tokenizer.model")));
  const std::vector<int32_t> tokens = SplitTokens(m, m.train);
  EXPECT_EQ(std::string(tokens.begin(), tokens.end()), "raw \xFF bytes\nsecond\n");
}

TEST_F(PrepareTest, DirectoriesAndGlobsInPathOrder) {
  fs::create_directories(Path("corpus/sub"));
  fs::create_directories(Path("corpus/.git"));
  Write("corpus/b.txt", "bee\n");
  Write("corpus/a.txt", "ay\n");
  Write("corpus/sub/c.txt", "sea\n");
  Write("corpus/.hidden", "no\n");
  Write("corpus/.git/HEAD", "no\n");
  auto dir = ExpandInputs({Path("corpus")});
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::vector<std::string> paths;
  for (const SourceFile& f : *dir) paths.push_back(f.path);
  EXPECT_THAT(paths, ElementsAre(Path("corpus/a.txt"), Path("corpus/b.txt"),
                                 Path("corpus/sub/c.txt")));
  auto glob = ExpandInputs({Path("corpus/*.txt"), Path("corpus/a.txt")});
  ASSERT_TRUE(glob.ok()) << glob.status();
  ASSERT_EQ(glob->size(), 2u);  // a.txt once
  EXPECT_EQ((*glob)[0].path, Path("corpus/a.txt"));
  EXPECT_EQ((*glob)[1].path, Path("corpus/b.txt"));
}

TEST_F(PrepareTest, UpToDateRerunAndForce) {
  const std::string a = Write("a.txt", Fortunes(50));
  PrepareOptions options = Options({a});
  ASSERT_TRUE(PrepareDataset(options).ok());
  const auto before = DirectoryContents(Path("out"));
  const auto mtime = fs::last_write_time(Path("out/manifest.json"));

  absl::StatusOr<PrepareResult> again = PrepareDataset(options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->up_to_date);
  EXPECT_EQ(fs::last_write_time(Path("out/manifest.json")), mtime);

  // Other options: refused without --force, the old dataset untouched.
  PrepareOptions other = options;
  other.val_fraction = 0.5;
  absl::StatusOr<PrepareResult> refused = PrepareDataset(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("--force"));
  EXPECT_EQ(DirectoryContents(Path("out")), before);

  // A changed input is not up to date either.
  Write("a.txt", Fortunes(51));
  EXPECT_THAT(PrepareDataset(options).status().message(), HasSubstr("is not this dataset"));

  options.force = true;
  absl::StatusOr<PrepareResult> forced = PrepareDataset(options);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_FALSE(forced->up_to_date);
  EXPECT_EQ(data::ReadManifest(Path("out")).value().sources[0].documents, 51);
  for (const auto& entry : fs::directory_iterator(dir_.path())) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".old-")));
  }
}

TEST_F(PrepareTest, RefusesAnExistingDirectoryThatIsNotADataset) {
  fs::create_directories(Path("out"));
  Write("out/precious.txt", "keep me");
  absl::StatusOr<PrepareResult> result = PrepareDataset(Options({Write("a.txt", Fortunes(5))}));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("no readable manifest"));
  EXPECT_EQ(ReadFile(Path("out/precious.txt")), "keep me");
}

// Every file under `dir` (recursively) with its bytes: what a refused --force must leave.
std::map<std::string, std::string> TreeContents(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path().string()] = ReadFile(entry.path().string());
  }
  return files;
}

TEST_F(PrepareTest, ForceReplacesOnlyAnotherDataset) {
  fs::create_directories(Path("corpus"));
  fs::create_directories(Path("other"));
  const std::string a = Write("corpus/a.txt", Fortunes(20));
  Write("notes.txt", "not a dataset");
  Write("other/precious.txt", "keep me");
  // A dataset made with other options: the one thing --force may replace...
  PrepareOptions old = Options({a}, "ds");
  old.val_fraction = 0.5;
  ASSERT_TRUE(PrepareDataset(old).ok());
  // ...unless one of this run's inputs lives inside it (here through a symlink).
  fs::create_directory_symlink(Path("ds"), Path("alias"));
  fs::create_directory_symlink(Path("corpus"), Path("corpus_link"));

  struct Case {
    std::string out;
    std::vector<std::string> inputs;
    std::string tokenizer;  // "": the fixture's
    std::string why;
  };
  const std::vector<Case> cases = {
      {"corpus", {a}, "", absl::StrCat("it contains the input ", Path("corpus/a.txt"))},
      {"corpus/a.txt", {a}, "", absl::StrCat("it is the input ", Path("corpus/a.txt"))},
      {"", {a}, "", "it contains the input"},  // the parent of everything
      {"corpus_link", {a}, "", "it contains the input"},
      {"notes.txt", {a}, "", "it is not a directory"},
      {"other", {a}, "", "it is not one (no manifest.json"},
      {"ds", {Path("alias/manifest.json")}, "",
       absl::StrCat("it contains the input ", Path("ds/manifest.json"))},
      {"ds", {a}, Path("ds/tokenizer.model"),
       absl::StrCat("it contains the input ", Path("ds/tokenizer.model"))},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.out);
    const auto before = TreeContents(dir_.path());
    PrepareOptions options = Options(c.inputs, c.out);
    if (!c.tokenizer.empty()) options.tokenizer_path = c.tokenizer;
    options.force = true;
    absl::StatusOr<PrepareResult> result = PrepareDataset(options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
    EXPECT_THAT(result.status().message(), HasSubstr("--out "));
    EXPECT_THAT(result.status().message(), HasSubstr(c.why));
    EXPECT_THAT(result.status().message(), HasSubstr("nothing was deleted"));
    // Nothing deleted, nothing left (the fixture's tok.model is rewritten with the same bytes).
    EXPECT_EQ(TreeContents(dir_.path()), before);
    for (const auto& entry : fs::directory_iterator(dir_.path())) {
      EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".tmp-")));
    }
  }

  // The dataset itself, inputs outside it: replaced.
  PrepareOptions options = Options({a}, "ds");
  options.force = true;
  absl::StatusOr<PrepareResult> replaced = PrepareDataset(options);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_FALSE(replaced->up_to_date);
}

TEST(ForcedReplaceTest, Decisions) {
  const std::vector<std::string> inputs = {"/data/corpus/a.txt", "/models/tok.model"};
  EXPECT_TRUE(DecideForcedReplace("/data/ds", true, true, inputs).replace);
  // A sibling whose name merely starts like an input's directory is not its ancestor.
  EXPECT_TRUE(DecideForcedReplace("/data/corp", true, true, inputs).replace);
  EXPECT_EQ(DecideForcedReplace("/data", true, true, inputs).reason,
            "it contains the input /data/corpus/a.txt");
  EXPECT_EQ(DecideForcedReplace("/", true, true, inputs).reason,
            "it contains the input /data/corpus/a.txt");
  EXPECT_EQ(DecideForcedReplace("/models/tok.model", false, false, inputs).reason,
            "it is the input /models/tok.model");
  EXPECT_EQ(DecideForcedReplace("/data/file", false, false, inputs).reason,
            "it is not a directory");
  EXPECT_THAT(DecideForcedReplace("/data/home", true, false, inputs).reason,
              HasSubstr("it is not one"));
}

// A dead run's DIR.tmp-<pid> is found beside a relative --out too (its parent is the working
// directory, not ""). The real kill of a running `trainctl data prepare` is in
// trainctl_data_test.cc.
TEST_F(PrepareTest, RelativeOutRemovesADeadRunsTemporary) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // now a pid no process has
  const std::string stale = Path(absl::StrCat("out.tmp-", child));
  fs::create_directories(stale);
  Write(absl::StrCat("out.tmp-", child, "/train-00000.bin"), "half-written");
  ASSERT_EQ(ReadFile(stale + "/train-00000.bin"), "half-written");

  PrepareOptions options = Options({Write("a.txt", Fortunes(10))});
  options.out_dir = "out";
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_.path());
  absl::StatusOr<PrepareResult> result = PrepareDataset(options);
  fs::current_path(cwd);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(fs::exists(Path("out/manifest.json")));
  EXPECT_FALSE(fs::exists(stale));
}

// "out/" is the directory out: its temporary is out.tmp-<pid> beside it, not inside.
TEST_F(PrepareTest, TrailingSlashOut) {
  PrepareOptions options = Options({Write("a.txt", Fortunes(10))});
  options.out_dir += "/";
  absl::StatusOr<PrepareResult> result = PrepareDataset(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(fs::exists(Path("out/manifest.json")));
  EXPECT_TRUE(PrepareDataset(options).value().up_to_date);
}

TEST_F(PrepareTest, InvalidUtf8NamesFileAndLine) {
  const std::string bad = Write("bad.txt", Fortunes(3) + "fine\nstill fine\nbro\xC3ken\n%\n");
  ExpectError(Options({Write("good.txt", Fortunes(20)), bad}),
              absl::StatusCode::kInvalidArgument, absl::StrCat(bad, ":12: invalid UTF-8 (byte 0xC3 at column 4)"));
}

TEST_F(PrepareTest, EmptyFile) {
  const std::string empty = Write("empty.txt", "");
  ExpectError(Options({Write("a.txt", Fortunes(5)), empty}),
              absl::StatusCode::kFailedPrecondition, absl::StrCat(empty, ": empty file"));
}

TEST_F(PrepareTest, JsonlErrorsNameFileLineAndField) {
  struct Case {
    std::string name, contents, error;
  };
  const std::vector<Case> cases = {
      {"a.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n", ":2: not a JSON value"},
      {"b.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"x\"}\n", ":3: no field \"text\""},
      {"c.jsonl", "{\"text\": 12}\n", ":1: field \"text\" is a number, not a string"},
      {"d.jsonl", "[1, 2]\n", ":1: a JSON array, not an object"},
      {"e.jsonl", "{\"text\": \"caf\xE9\"}\n", ":1: invalid UTF-8 (byte 0xE9 at column 14)"},
  };
  for (const Case& c : cases) {
    const std::string path = Write(c.name, c.contents);
    ExpectError(Options({path}), absl::StatusCode::kInvalidArgument, path + c.error);
  }
}

TEST_F(PrepareTest, MissingInputs) {
  ExpectError(Options({Path("*.nothing")}), absl::StatusCode::kInvalidArgument,
              "no file matches the glob");
  ExpectError(Options({Path("absent.txt")}), absl::StatusCode::kNotFound, "absent.txt");
  ExpectError(Options({}), absl::StatusCode::kInvalidArgument, "no inputs");
  PrepareOptions no_tokenizer = Options({Write("a.txt", "x")});
  no_tokenizer.tokenizer_path = Path("absent.model");
  ExpectError(no_tokenizer, absl::StatusCode::kNotFound, "absent.model");
}

TEST_F(PrepareTest, OutputDirectoryNotWritable) {
  Write("file", "a regular file where a directory would go");
  PrepareOptions options = Options({Write("a.txt", Fortunes(5))}, "file/out");
  absl::StatusOr<PrepareResult> result = PrepareDataset(options);
  EXPECT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("cannot create"));
  EXPECT_FALSE(fs::exists(Path("file/out")));
}

TEST_F(PrepareTest, EverythingInValidationIsAnError) {
  PrepareOptions options = Options({Write("a.txt", "one document only\n")});
  options.val_fraction = 0.999;
  // With one document the hash decides; find a seed that sends it to validation.
  for (options.seed = 0; options.seed < 100; ++options.seed) {
    absl::StatusOr<PrepareResult> result = PrepareDataset(options);
    if (result.ok()) {
      std::filesystem::remove_all(options.out_dir);
      continue;
    }
    EXPECT_THAT(result.status().message(), HasSubstr("no training tokens"));
    ExpectNothingLeft();
    return;
  }
  FAIL() << "no seed sent the only document to validation";
}

TEST_F(PrepareTest, BadOptions) {
  PrepareOptions options = Options({Write("a.txt", "x")});
  options.val_fraction = 1;
  ExpectError(options, absl::StatusCode::kInvalidArgument, "--val-fraction");
  options = Options({Path("a.txt")});
  options.shard_tokens = 0;
  ExpectError(options, absl::StatusCode::kInvalidArgument, "--shard-tokens");
}

// ---------------------------------------------------------------------------------------
// Chat data (--chat): tests/fixtures/chat holds conversations and what transformers makes of
// them with each template's fixture tokenizer (make_chat_fixtures.py there).

std::string ChatFixture(const std::string& name) {
  return std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/chat/" + name;
}

// expected.json in its own key order: the conversations in the order of conversations.jsonl.
const nlohmann::ordered_json& ChatExpected() {
  static const auto* const kExpected = new nlohmann::ordered_json(
      nlohmann::ordered_json::parse(ReadFile(ChatFixture("expected.json"))));
  return *kExpected;
}

// All flags of one split, in shard order; each flags file as the manifest describes it and as
// the training side checks it.
std::vector<uint8_t> SplitFlags(const data::DatasetManifest& m,
                                const std::vector<data::ManifestShard>& split) {
  std::vector<uint8_t> all;
  for (const data::ManifestShard& s : split) {
    EXPECT_EQ(s.flags_file, absl::StrCat(s.file.substr(0, s.file.size() - 4), ".flags"));
    const std::string bytes = ReadFile(data::ManifestFilePath(m, s.flags_file));
    EXPECT_EQ(static_cast<int64_t>(bytes.size()), s.flags_bytes);
    EXPECT_EQ(Crc32c(bytes.data(), bytes.size()), s.flags_crc32c);
    EXPECT_TRUE(data::CheckTokenFlags(reinterpret_cast<const unsigned char*>(bytes.data()),
                                      bytes.size(), s.tokens, s.flags_file)
                    .ok());
    all.insert(all.end(), bytes.begin() + data::kTokenFlagsHeaderBytes, bytes.end());
  }
  return all;
}

class ChatPrepareTest : public PrepareTest, public ::testing::WithParamInterface<std::string> {
 protected:
  std::string TokenizerFor(const std::string& chat_template) {
    return std::string(WEFT_SOURCE_DIR) + "/" +
           ChatExpected().at("templates").at(chat_template).at("tokenizer").get<std::string>();
  }

  PrepareOptions ChatOptions(std::vector<std::string> inputs,
                             const std::string& chat_template = "chatml") {
    PrepareOptions o = Options(std::move(inputs));
    o.doc_separator.clear();
    o.chat_template = chat_template;
    o.tokenizer_path = TokenizerFor(chat_template);
    o.val_fraction = 0;
    return o;
  }
};

// Every conversation the template takes, prepared across several shards: the token stream is
// transformers' ids of each rendered conversation, back to back with no separator, and the
// flags mark each conversation's first token and transformers' assistant tokens.
TEST_P(ChatPrepareTest, TokensAndFlagsAreTransformers) {
  const nlohmann::ordered_json& cases = ChatExpected().at("templates").at(GetParam()).at("cases");
  const std::vector<std::string> lines =
      absl::StrSplit(ReadFile(ChatFixture("conversations.jsonl")), '\n', absl::SkipEmpty());
  std::string input;
  std::vector<int32_t> want_ids;
  std::vector<uint8_t> want_flags;
  int64_t conversations = 0, targets = 0;
  size_t line = 0;
  for (const auto& [name, unused] : ChatExpected().at("conversations").items()) {
    ASSERT_LT(line, lines.size());
    const nlohmann::ordered_json& expected = cases.at(name);
    if (!expected.contains("error")) {
      absl::StrAppend(&input, lines[line], "\n");
      const auto ids = expected.at("ids").get<std::vector<int32_t>>();
      const auto mask = expected.at("assistant_mask").get<std::vector<int>>();
      want_ids.insert(want_ids.end(), ids.begin(), ids.end());
      for (size_t i = 0; i < mask.size(); ++i) {
        want_flags.push_back((mask[i] ? data::kTokenFlagLoss : 0) |
                             (i == 0 ? data::kTokenFlagDocStart : 0));
        targets += mask[i];
      }
      ++conversations;
    }
    ++line;
  }
  PrepareOptions options = ChatOptions({Write("chat.jsonl", input)}, GetParam());
  options.shard_tokens = 97;  // conversations continue into the next shard
  absl::StatusOr<PrepareResult> result = PrepareDataset(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->train_documents, conversations);
  EXPECT_EQ(result->train_target_tokens, targets);

  absl::StatusOr<data::DatasetManifest> m = data::ReadManifest(Path("out"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(ReadFile(Path("out/manifest.json")), HasSubstr("\"version\": 2"));
  EXPECT_EQ(m->chat_template, GetParam());
  EXPECT_EQ(m->loss_mask, "assistant");
  EXPECT_EQ(m->document_separator, "none");
  EXPECT_TRUE(m->val.empty());
  ASSERT_GT(m->train.size(), 3u);
  EXPECT_EQ(SplitTokens(*m, m->train), want_ids);
  EXPECT_EQ(SplitFlags(*m, m->train), want_flags);
  const nlohmann::json recorded = nlohmann::json::parse(m->options_json);
  EXPECT_EQ(recorded.at("chat_template"), GetParam());
  EXPECT_EQ(recorded.at("loss_mask"), "assistant");

  EXPECT_TRUE(PrepareDataset(options).value().up_to_date);

  // Every token a target under "all"; the tokens are the same.
  options.loss_mask = "all";
  options.force = true;
  result = PrepareDataset(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->up_to_date);
  m = data::ReadManifest(Path("out"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->loss_mask, "all");
  EXPECT_EQ(SplitTokens(*m, m->train), want_ids);
  const std::vector<uint8_t> flags = SplitFlags(*m, m->train);
  ASSERT_EQ(flags.size(), want_flags.size());
  for (size_t i = 0; i < flags.size(); ++i) {
    EXPECT_EQ(flags[i], data::kTokenFlagLoss | (want_flags[i] & data::kTokenFlagDocStart)) << i;
  }
  EXPECT_EQ(result->train_target_tokens, static_cast<int64_t>(want_ids.size()));
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatPrepareTest,
                         ::testing::Values("llama3", "llama3.1", "chatml", "mistral"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '.' ? '_' : c;
                           return name;
                         });

// Conversations are split between train and validation like documents, whole, with the same
// thread-independent bytes.
TEST_F(PrepareTest, ChatSplitAndThreads) {
  std::string input;
  for (int i = 0; i < 60; ++i) {
    absl::StrAppend(&input, R"({"prompt": "question )", i, R"(", "completion": "answer )", i,
                    "\"}\n");
  }
  PrepareOptions one = Options({Write("chat.jsonl", input)}, "one");
  one.doc_separator.clear();
  one.chat_template = "chatml";
  one.tokenizer_path = ChatFixture("chatml.tokenizer.json");
  one.val_fraction = 0.3;
  one.threads = 1;
  one.shard_tokens = 300;
  PrepareOptions four = one;
  four.out_dir = Path("four");
  four.threads = 4;
  absl::StatusOr<PrepareResult> a = PrepareDataset(one);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(PrepareDataset(four).ok());
  EXPECT_EQ(DirectoryContents(Path("one")), DirectoryContents(Path("four")));
  EXPECT_EQ(a->train_documents + a->val_documents, 60);
  EXPECT_GT(a->val_documents, 5);
  EXPECT_GT(a->val_target_tokens, 0);
  absl::StatusOr<data::DatasetManifest> m = data::ReadManifest(Path("one"));
  ASSERT_TRUE(m.ok()) << m.status();
  int starts = 0;
  for (uint8_t f : SplitFlags(*m, m->val)) starts += (f & data::kTokenFlagDocStart) ? 1 : 0;
  EXPECT_EQ(starts, a->val_documents);
}

TEST_F(PrepareTest, ChatInputErrorsNameFileLineAndField) {
  struct Case {
    std::string contents, error;
  };
  const std::string ok = R"({"prompt": "p", "completion": "c"})";
  const std::vector<Case> cases = {
      {ok + "\n{\"messages\": [}\n", ":2: not a JSON value"},
      {"[1]\n", ":1: an array, not an object with \"messages\""},
      {R"({"text": "plain"})", ":1: no \"messages\", nor \"prompt\" and \"completion\""},
      {R"({"prompt": "only"})", ":1: completion: missing"},
      {R"({"prompt": 1, "completion": "c"})", ":1: prompt: a number, not a string"},
      {R"({"messages": {"role": "user"}})", ":1: messages: an object, not an array"},
      {R"({"messages": []})", ":1: messages: empty"},
      {ok + "\n\n" +
           R"({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]})",
       ":3: messages[1].role: \"tool\" is not a role (system, user or assistant)"},
      {R"({"messages": [{"content": "hi"}]})", ":1: messages[0].role: missing"},
      {R"({"messages": [{"role": "user"}]})", ":1: messages[0].content: missing"},
      {R"({"messages": [{"role": "user", "content": null}]})",
       ":1: messages[0].content: a null, not a string"},
      {R"({"messages": [{"role": "user", "content": "hi", "name": "bob"}]})",
       ":1: messages[0].name: unknown field"},
      {R"({"messages": ["hi"]})", ":1: messages[0]: a string, not an object"},
      {"{\"prompt\": \"caf\xE9\", \"completion\": \"c\"}\n", ":1: invalid UTF-8"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = Write(absl::StrCat("bad", i, ".jsonl"), cases[i].contents + "\n");
    PrepareOptions options = Options({path});
    options.chat_template = "chatml";
    options.tokenizer_path = ChatFixture("chatml.tokenizer.json");
    ExpectError(options, absl::StatusCode::kInvalidArgument, path + cases[i].error);
  }
}

TEST_F(PrepareTest, ChatConversationTheTemplateRefusesNamesItsLine) {
  PrepareOptions options = Options({ChatFixture("conversations.jsonl")});
  options.chat_template = "mistral";
  options.tokenizer_path = ChatFixture("mistral.tokenizer.json");
  ExpectError(options, absl::StatusCode::kInvalidArgument,
              ChatFixture("conversations.jsonl") +
                  ":9: chat template mistral: messages[2] is a system message");
}

TEST_F(PrepareTest, ChatOptionErrors) {
  const std::string input = Write("chat.jsonl", R"({"prompt": "p", "completion": "c"})");
  PrepareOptions options = Options({input});
  options.chat_template = "alpaca";
  options.tokenizer_path = ChatFixture("chatml.tokenizer.json");
  ExpectError(options, absl::StatusCode::kInvalidArgument,
              "--template: unknown chat template \"alpaca\" (known: chatml, llama3, llama3.1, "
              "mistral)");
  options.chat_template = "chatml";
  options.loss_mask = "user";
  ExpectError(options, absl::StatusCode::kInvalidArgument, "--loss-mask user");
  options.loss_mask = "assistant";
  options.tokenizer_path.clear();
  ExpectError(options, absl::StatusCode::kInvalidArgument, "--chat: needs --tokenizer");
  // A tokenizer without the template's special tokens, named with the token.
  const std::string gpt2 =
      std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/tokenizers/gpt2.tokenizer.json";
  options.tokenizer_path = gpt2;
  ExpectError(options, absl::StatusCode::kFailedPrecondition,
              gpt2 + ": no token \"<|im_start|>\", which chat template chatml needs");
  options.tokenizer_path = ChatFixture("chatml.tokenizer.json");
  options.chat_template = "llama3";
  ExpectError(options, absl::StatusCode::kFailedPrecondition,
              "no token \"<|begin_of_text|>\", which chat template llama3 needs");
  // SentencePiece never spells its control tokens from text.
  options.tokenizer_path = Write("tok.model", *model_);
  options.chat_template = "mistral";
  ExpectError(options, absl::StatusCode::kFailedPrecondition,
              "a sentencepiece tokenizer cannot spell special tokens in text");
  // Text files are no conversations.
  options = Options({Write("a.txt", "plain text\n")});
  options.chat_template = "chatml";
  options.tokenizer_path = ChatFixture("chatml.tokenizer.json");
  ExpectError(options, absl::StatusCode::kInvalidArgument,
              Path("a.txt") + ": --chat reads conversations from JSONL files");
}

TEST_F(PrepareTest, ChatWithoutAssistantMessages) {
  PrepareOptions options =
      Options({Write("chat.jsonl", R"({"messages": [{"role": "user", "content": "hello?"}]})")});
  options.chat_template = "chatml";
  options.tokenizer_path = ChatFixture("chatml.tokenizer.json");
  options.val_fraction = 0;
  ExpectError(options, absl::StatusCode::kFailedPrecondition, "no target tokens");
  options.loss_mask = "all";
  absl::StatusOr<PrepareResult> result = PrepareDataset(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->train_target_tokens, result->train_tokens);
}

TEST(JsonlConversationTest, BothFormsAndFieldsBesideMessages) {
  absl::StatusOr<std::vector<data::ChatMessage>> pc =
      JsonlConversation(R"({"prompt": "2+2?", "completion": "4", "id": 7})", "f.jsonl", 1);
  ASSERT_TRUE(pc.ok()) << pc.status();
  ASSERT_EQ(pc->size(), 2u);
  EXPECT_EQ((*pc)[0].role, data::ChatRole::kUser);
  EXPECT_EQ((*pc)[0].content, "2+2?");
  EXPECT_EQ((*pc)[1].role, data::ChatRole::kAssistant);
  EXPECT_EQ((*pc)[1].content, "4");
  // UltraChat's lines keep their first prompt beside the messages: the messages are read.
  absl::StatusOr<std::vector<data::ChatMessage>> m = JsonlConversation(
      R"({"prompt": "ignored", "prompt_id": "x", "messages": [{"role": "system", "content": "s"},
      {"content": "u", "role": "user"}, {"role": "assistant", "content": ""}]})",
      "f.jsonl", 1);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0].role, data::ChatRole::kSystem);
  EXPECT_EQ((*m)[1].content, "u");
  EXPECT_EQ((*m)[2].content, "");
}

TEST(TokenFormatTest, ByVocabularySize) {
  EXPECT_EQ(TokenFormatForVocab(256).value(), weft::v1::DATA_FORMAT_UINT16_BIN);
  EXPECT_EQ(TokenFormatForVocab(65536).value(), weft::v1::DATA_FORMAT_UINT16_BIN);
  EXPECT_EQ(TokenFormatForVocab(65537).value(), weft::v1::DATA_FORMAT_UINT32_BIN);
  EXPECT_EQ(TokenFormatForVocab(128256).value(), weft::v1::DATA_FORMAT_UINT32_BIN);
  EXPECT_THAT(TokenFormatForVocab(int64_t{1} << 25).status().message(),
              HasSubstr("larger than any model's vocab_size"));
  EXPECT_THAT(TokenFormatForVocab(int64_t{1} << 33).status().message(),
              HasSubstr("too large for uint32"));
}

}  // namespace
}  // namespace weft::dataprep
