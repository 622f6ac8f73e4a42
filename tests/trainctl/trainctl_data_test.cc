// `trainctl data train-tokenizer` and `trainctl data prepare` as a user runs them: the real
// binary, its exit codes and messages (the library's cases are in data_prepare_test.cc).
#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using weft::testing::CommandResult;
using weft::testing::ReadFile;
using weft::testing::RunCommand;
using weft::testing::WriteFile;

class TrainctlDataTest : public ::testing::Test {
 protected:
  CommandResult Run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {weft::testing::BinDir() + "/trainctl"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, {}, absl::Seconds(60));
  }

  std::string Corpus() {
    std::string text;
    const std::vector<std::string> lines = {
        "Fortune favours the bold.", "Ничто не вечно под луной.", "To be or not to be.",
        "The early bird catches the worm, but the second mouse gets the cheese."};
    for (int i = 0; i < 120; ++i) {
      absl::StrAppend(&text, lines[i % lines.size()], " ", i, "\n",
                      lines[(i + 1) % lines.size()], "\n%\n");
    }
    const std::string path = dir_.File("corpus.txt");
    WriteFile(path, text);
    return path;
  }

  weft::testing::TempDir dir_;
};

TEST_F(TrainctlDataTest, TrainTokenizerThenPrepare) {
  const std::string corpus = Corpus();
  const std::string model = dir_.File("tok.model");
  CommandResult trained = Run({"data", "train-tokenizer", "--out", model, "--vocab-size", "400",
                               "--doc-separator", "%", corpus});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_THAT(trained.out, HasSubstr("400 pieces"));
  CommandResult again = Run({"data", "train-tokenizer", "--out", dir_.File("tok2.model"),
                             "--vocab-size", "400", "--doc-separator", "%", corpus});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(ReadFile(model), ReadFile(dir_.File("tok2.model")));

  const std::string out1 = dir_.File("ds1");
  CommandResult one = Run({"data", "prepare", "--out", out1, "--tokenizer", model,
                           "--doc-separator", "%", "--threads", "1", corpus});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_THAT(one.out, HasSubstr("wrote " + out1));
  // stderr is not a terminal here: plain progress lines, no bar.
  EXPECT_THAT(one.err, ::testing::Not(HasSubstr("\r")));
  const std::string out2 = dir_.File("ds2");
  CommandResult two = Run({"data", "prepare", "--out", out2, "--tokenizer", model,
                           "--doc-separator", "%", "--threads", "2", "--quiet", corpus});
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_EQ(two.err, "");
  EXPECT_EQ(ReadFile(out1 + "/manifest.json"), ReadFile(out2 + "/manifest.json"));
  EXPECT_EQ(ReadFile(out1 + "/train-00000.bin"), ReadFile(out2 + "/train-00000.bin"));

  CommandResult rerun = Run({"data", "prepare", "--out", out1, "--tokenizer", model,
                             "--doc-separator", "%", "-q", corpus});
  EXPECT_EQ(rerun.exit_code, 0) << rerun.err;
  EXPECT_THAT(rerun.out, HasSubstr("up to date"));

  CommandResult other = Run({"data", "prepare", "--out", out1, "--bytes", "-q", corpus});
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_THAT(other.err, HasSubstr("--force"));
  CommandResult forced =
      Run({"data", "prepare", "--out", out1, "--bytes", "-q", "--force", corpus});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_THAT(ReadFile(out1 + "/manifest.json"), HasSubstr("\"kind\": \"bytes\""));
}

// A prepare killed mid-way leaves DIR.tmp-<pid>; the next prepare of DIR removes it, also when
// --out is relative (its siblings are then in the working directory).
TEST_F(TrainctlDataTest, NextPrepareRemovesAKilledOnesTemporary) {
  std::string big;
  while (big.size() < (size_t{4} << 20)) absl::StrAppend(&big, "All work and no play. ", big.size());
  WriteFile(dir_.File("big.txt"), big);
  WriteFile(dir_.File("small.txt"), "a small corpus\n");
  const std::string cd = absl::StrCat("cd '", dir_.path(), "' && exec '",
                                      weft::testing::BinDir(), "/trainctl' data prepare ");
  // Thousands of tiny shards, each fsynced: the run is still busy when it is killed.
  auto process = weft::testing::Subprocess::Start(
      {"/bin/sh", "-c", cd + "--out ds --bytes -q --threads 1 --shard-tokens 1024 big.txt"},
      dir_.File("killed.log"));
  ASSERT_TRUE(process.ok()) << process.status();
  const std::string temp = dir_.File(absl::StrCat("ds.tmp-", (*process)->pid()));
  ASSERT_TRUE(weft::testing::Eventually(
      [&] {
        return std::filesystem::exists(temp + "/train-00002.bin") || !(*process)->Running();
      },
      absl::Seconds(30)));
  ASSERT_TRUE((*process)->Running()) << "finished before it could be killed: "
                                     << ReadFile(dir_.File("killed.log"));
  (*process)->Signal(SIGKILL);
  ASSERT_EQ((*process)->Wait(absl::Seconds(10)).value(), 128 + SIGKILL);
  ASSERT_TRUE(std::filesystem::exists(temp));  // what the kill left

  CommandResult next = RunCommand({"/bin/sh", "-c", cd + "--out ds --bytes -q small.txt"});
  ASSERT_EQ(next.exit_code, 0) << next.err;
  EXPECT_TRUE(std::filesystem::exists(dir_.File("ds/manifest.json")));
  EXPECT_FALSE(std::filesystem::exists(temp));
}

// --force replaces another dataset, never the inputs: here --out names the corpus's directory.
TEST_F(TrainctlDataTest, ForceRefusesToReplaceTheInputs) {
  const std::string corpus = Corpus();
  CommandResult forced =
      Run({"data", "prepare", "--out", dir_.path(), "--bytes", "-q", "--force", corpus});
  EXPECT_EQ(forced.exit_code, 1);
  EXPECT_THAT(forced.err, HasSubstr(absl::StrCat("--out ", dir_.path(), ": --force replaces only "
                                                 "another Weft dataset, and it contains the "
                                                 "input ", corpus)));
  EXPECT_TRUE(std::filesystem::exists(corpus));
}

TEST_F(TrainctlDataTest, Refusals) {
  const std::string corpus = Corpus();
  CommandResult neither = Run({"data", "prepare", "--out", dir_.File("ds"), corpus});
  EXPECT_EQ(neither.exit_code, 1);
  EXPECT_THAT(neither.err, HasSubstr("--tokenizer FILE"));

  const std::string bad = dir_.File("bad.jsonl");
  WriteFile(bad, "{\"text\": \"fine\"}\n{\"content\": \"no text field\"}\n");
  CommandResult jsonl =
      Run({"data", "prepare", "--out", dir_.File("ds"), "--bytes", "-q", corpus, bad});
  EXPECT_EQ(jsonl.exit_code, 1);
  EXPECT_THAT(jsonl.err, HasSubstr(absl::StrCat(bad, ":2: no field \"text\"")));
  EXPECT_FALSE(std::filesystem::exists(dir_.File("ds")));

  CommandResult tiny = Run({"data", "train-tokenizer", "--out", dir_.File("t.model"),
                            "--vocab-size", "100", corpus});
  EXPECT_EQ(tiny.exit_code, 1);
  EXPECT_THAT(tiny.err, HasSubstr("vocab_size 100"));
  EXPECT_FALSE(std::filesystem::exists(dir_.File("t.model")));
}

// --kind tokenizer.json: a byte-level BPE tokenizer.json and its tokenizer_config.json in
// --out DIR, the same bytes every run, which prepare (text and chat) then uses.
TEST_F(TrainctlDataTest, TrainTokenizerJsonThenPrepare) {
  const std::string corpus = Corpus();
  const std::string dir = dir_.File("tok");
  CommandResult trained = Run({"data", "train-tokenizer", "--kind", "tokenizer.json",
                               "--vocab-size", "300", "--out", dir, "--doc-separator", "%",
                               corpus});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_THAT(trained.out, HasSubstr(absl::StrCat("wrote ", dir, "/tokenizer.json and "
                                                  "tokenizer_config.json: byte-level BPE, "
                                                  "llama3 style, 300 tokens (256 bytes, 39 "
                                                  "merges, 5 special; bos 295, eos 296)")));
  EXPECT_THAT(ReadFile(dir + "/tokenizer_config.json"),
              HasSubstr("\"eos_token\": \"<|end_of_text|>\""));
  // --special once per token: the corpus after it is an input, not a second special token.
  CommandResult again = Run({"-o", "json", "data", "train-tokenizer", "--kind", "tokenizer.json",
                             "--vocab-size", "300", "--out", dir_.File("tok2"),
                             "--doc-separator", "%", "--threads", "1", "--style", "gpt2",
                             "--special", "<|endoftext|>", corpus});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("\"special_tokens\": 1"));
  EXPECT_THAT(again.out, HasSubstr("\"eos_id\": 299"));
  CommandResult same = Run({"data", "train-tokenizer", "--kind", "tokenizer.json",
                            "--vocab-size", "300", "--out", dir_.File("tok3"),
                            "--doc-separator", "%", "--style", "gpt2", corpus});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(ReadFile(dir_.File("tok2/tokenizer.json")), ReadFile(dir_.File("tok3/tokenizer.json")));

  const std::string data = dir_.File("ds");
  CommandResult prepared = Run({"data", "prepare", "--out", data, "--tokenizer",
                                dir + "/tokenizer.json", "--doc-separator", "%", "-q", corpus});
  ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
  const std::string manifest = ReadFile(data + "/manifest.json");
  EXPECT_THAT(manifest, HasSubstr("\"kind\": \"tokenizer.json\""));
  EXPECT_THAT(manifest, HasSubstr("\"eos_id\": 296"));
  EXPECT_THAT(manifest, HasSubstr("\"vocab_size\": 300"));
  // The llama3 style's special tokens are what its chat template needs.
  const std::string chat = dir_.File("chat.jsonl");
  WriteFile(chat, R"({"prompt": "Fortune favours?", "completion": "the bold."})" "\n");
  CommandResult sft = Run({"data", "prepare", "--chat", "--template", "llama3", "--out",
                           dir_.File("sft"), "--tokenizer", dir + "/tokenizer.json",
                           "--val-fraction", "0", "-q", chat});
  EXPECT_EQ(sft.exit_code, 0) << sft.err;

  // Refused before anything is written, naming the flag.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--vocab-size", "100"}, "--vocab-size 100: must lie in [261, 16777216]"},
      {{"--vocab-size", "300", "--style", "llama2"}, "--style \"llama2\": not one of"},
      {{"--vocab-size", "300", "--model-type", "unigram"},
       "--model-type is for --kind sentencepiece"},
      {{"--vocab-size", "300", "--special", "<a>", "--special", "<a>"},
       "--special \"<a>\": given twice"},
      {{"--vocab-size", "300", "--eos", "</s>"}, "--eos \"</s>\": not one of the special"},
  };
  for (const auto& [flags, message] : refused) {
    std::vector<std::string> args = {"data", "train-tokenizer", "--kind", "tokenizer.json",
                                     "--out", dir_.File("no")};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back(corpus);
    CommandResult r = Run(args);
    EXPECT_EQ(r.exit_code, 1) << absl::StrJoin(flags, " ");
    EXPECT_THAT(r.err, HasSubstr(message));
  }
  CommandResult spm_flag = Run({"data", "train-tokenizer", "--out", dir_.File("no.model"),
                                "--vocab-size", "300", "--style", "gpt2", corpus});
  EXPECT_EQ(spm_flag.exit_code, 1);
  EXPECT_THAT(spm_flag.err, HasSubstr("--style is for --kind tokenizer.json"));
  const std::string specials_only = dir_.File("specials.txt");
  WriteFile(specials_only, "<|end_of_text|>");
  CommandResult empty = Run({"data", "train-tokenizer", "--kind", "tokenizer.json",
                             "--vocab-size", "300", "--out", dir_.File("no"), specials_only});
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_THAT(empty.err, HasSubstr("INPUTS: no text to learn from"));
  CommandResult file_out = Run({"data", "train-tokenizer", "--kind", "tokenizer.json",
                                "--vocab-size", "300", "--out", corpus, corpus});
  EXPECT_EQ(file_out.exit_code, 1);
  EXPECT_THAT(file_out.err, HasSubstr(absl::StrCat("--out ", corpus, ": not a directory")));
  EXPECT_FALSE(std::filesystem::exists(dir_.File("no")));
}

// `prepare --chat` as a user runs it: flags, messages and what it writes.
TEST_F(TrainctlDataTest, PrepareChat) {
  const std::string tokenizer =
      std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/chat/chatml.tokenizer.json";
  const std::string chat = dir_.File("chat.jsonl");
  std::string lines;
  for (int i = 0; i < 20; ++i) {
    absl::StrAppend(&lines, R"({"messages": [{"role": "user", "content": "question )", i,
                    R"("}, {"role": "assistant", "content": "answer )", i, "\"}]}\n");
  }
  WriteFile(chat, lines);
  const std::string out = dir_.File("sft");
  CommandResult prepared = Run({"data", "prepare", "--chat", "--template", "chatml", "--out", out,
                                "--tokenizer", tokenizer, "-q", chat});
  ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
  EXPECT_THAT(prepared.out, HasSubstr("chat template chatml, loss mask assistant: "));
  EXPECT_TRUE(std::filesystem::exists(out + "/train-00000.flags"));
  const std::string manifest = ReadFile(out + "/manifest.json");
  EXPECT_THAT(manifest, HasSubstr("\"template\": \"chatml\""));
  EXPECT_THAT(manifest, HasSubstr("\"loss_mask\": \"assistant\""));

  CommandResult all = Run({"-o", "json", "data", "prepare", "--chat", "--template", "chatml",
                           "--loss-mask", "all", "--out", dir_.File("sft_all"), "--tokenizer",
                           tokenizer, "-q", chat});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_THAT(all.out, HasSubstr("\"train_target_tokens\""));

  // --template and --loss-mask belong to --chat, which needs --template and a tokenizer and
  // takes no text options.
  const std::vector<std::vector<std::string>> refused = {
      {"--template", "chatml", "--tokenizer", tokenizer},
      {"--chat", "--tokenizer", tokenizer},
      {"--loss-mask", "all", "--tokenizer", tokenizer},
      {"--chat", "--template", "chatml", "--bytes"},
      {"--chat", "--template", "chatml", "--tokenizer", tokenizer, "--jsonl-field", "x"},
      {"--chat", "--template", "chatml", "--tokenizer", tokenizer, "--doc-separator", "%"},
  };
  for (const std::vector<std::string>& flags : refused) {
    std::vector<std::string> args = {"data", "prepare", "--out", dir_.File("no"), "-q"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back(chat);
    CommandResult r = Run(args);
    EXPECT_NE(r.exit_code, 0) << absl::StrJoin(flags, " ");
  }
  CommandResult unknown = Run({"data", "prepare", "--chat", "--template", "vicuna", "--out",
                               dir_.File("no"), "--tokenizer", tokenizer, "-q", chat});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("unknown chat template \"vicuna\""));
  const std::string gpt2 =
      std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/tokenizers/gpt2.tokenizer.json";
  CommandResult no_token = Run({"data", "prepare", "--chat", "--template", "chatml", "--out",
                                dir_.File("no"), "--tokenizer", gpt2, "-q", chat});
  EXPECT_EQ(no_token.exit_code, 1);
  EXPECT_THAT(no_token.err, HasSubstr(gpt2 + ": no token \"<|im_start|>\""));
  EXPECT_FALSE(std::filesystem::exists(dir_.File("no")));
}

// `data batches`: the rows a job's ranks read, as JSON for masked_loss.py (tests/examples/
// sft_e2e_test.cc checks them against TokenDataset itself, and the loss against transformers).
TEST_F(TrainctlDataTest, Batches) {
  const std::string chat = dir_.File("chat.jsonl");
  std::string lines;
  for (int i = 0; i < 30; ++i) {
    absl::StrAppend(&lines, R"({"messages": [{"role": "system", "content": "Be brief."}, )",
                    R"({"role": "user", "content": "question )", i,
                    R"("}, {"role": "assistant", "content": "answer )", i, "\"}]}\n");
  }
  WriteFile(chat, lines);
  const std::string data = dir_.File("sft");
  CommandResult prepared =
      Run({"data", "prepare", "--chat", "--template", "chatml", "--out", data, "--tokenizer",
           std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/chat/chatml.tokenizer.json",
           "--val-fraction", "0.3", "-q", chat});
  ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
  const auto spec = [&](int max_workers, int val_interval) {
    const std::string path = dir_.File(absl::StrCat("job", max_workers, val_interval, ".pb.txt"));
    WriteFile(path, absl::StrCat(R"pb(
      name: "batches"
      model { num_layers: 1 hidden_size: 32 num_heads: 2 vocab_size: 576 context_length: 64 }
      data { manifest_path: ")pb", data, R"pb(" sampling: PACKED document_masking: true
             reset_positions: true }
      optimizer { learning_rate: 0.001 }
      training { total_steps: 10 micro_batch_size: 2 sequence_length: 64 grad_accum_steps: 3
                 val_interval_steps: )pb", val_interval, R"pb( val_batches: 2 }
      resources { device_kind: DEVICE_KIND_CPU min_workers: 2 max_workers: )pb", max_workers,
                                 " }"));
    return path;
  };
  const auto rows = [](const std::string& json, const std::string& field) {
    const size_t at = json.find("\"" + field + "\":[[");
    if (at == std::string::npos) return -1;
    int n = 1;
    // Rows are "],[" apart until the matrix's "]]".
    for (size_t i = at; i < json.find("]]", at); ++i) n += json.compare(i, 3, "],[") == 0;
    return n;
  };

  // Validation: val_batches x world x micro_batch_size rows; training: grad_accum_steps x ...
  CommandResult val = Run({"data", "batches", spec(2, 5)});
  ASSERT_EQ(val.exit_code, 0) << val.err;
  EXPECT_EQ(rows(val.out, "inputs"), 2 * 2 * 2);
  EXPECT_EQ(rows(val.out, "targets"), 2 * 2 * 2);
  EXPECT_EQ(rows(val.out, "doc_starts"), 2 * 2 * 2);
  EXPECT_THAT(val.out, HasSubstr("\"reset_positions\":true"));
  EXPECT_THAT(val.out, HasSubstr(",-1,"));  // the prompts' targets are ignored
  CommandResult train = Run({"data", "batches", spec(2, 5), "--split", "train", "--step", "4"});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  EXPECT_EQ(rows(train.out, "inputs"), 3 * 2 * 2);
  CommandResult wider =
      Run({"data", "batches", spec(3, 5), "--split", "train", "--world", "3"});
  ASSERT_EQ(wider.exit_code, 0) << wider.err;
  EXPECT_EQ(rows(wider.out, "inputs"), 3 * 3 * 2);

  // The world must be known; validation must be on; the spec must be one.
  CommandResult unknown_world = Run({"data", "batches", spec(3, 5)});
  EXPECT_EQ(unknown_world.exit_code, 1);
  EXPECT_THAT(unknown_world.err, HasSubstr("on 2 to 3 workers: pass --world"));
  CommandResult no_val = Run({"data", "batches", spec(2, 0)});
  EXPECT_EQ(no_val.exit_code, 1);
  EXPECT_THAT(no_val.err, HasSubstr("no validation"));
  const std::string bad = dir_.File("bad.pb.txt");
  WriteFile(bad, "training { total_steps: -1 }");
  CommandResult invalid = Run({"data", "batches", bad});
  EXPECT_EQ(invalid.exit_code, 1);
  EXPECT_THAT(invalid.err, HasSubstr("total_steps"));
  EXPECT_NE(Run({"data", "batches", spec(2, 5), "--split", "test"}).exit_code, 0);
}

}  // namespace
}  // namespace weft
