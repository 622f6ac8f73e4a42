// trainctl's data subcommands, local work with no daemon involved:
//   trainctl data train-tokenizer --out tok.model --vocab-size N [--model-type bpe|unigram]
//                                 INPUTS...            a SentencePiece model of the text
//   trainctl data train-tokenizer --kind tokenizer.json [--style gpt2|llama3|qwen2]
//                                 [--special TOKEN]... --vocab-size N --out DIR INPUTS...
//                                                      a byte-level BPE tokenizer.json
//   trainctl data prepare --out DIR [--tokenizer tok.model | --bytes] INPUTS...
//                                                      token shards + manifest (docs/data.md)
//   trainctl data prepare --chat --template NAME [--loss-mask assistant|all]
//                         --out DIR --tokenizer tokenizer.json CONVERSATIONS.jsonl...
//                                                      the same with token flags: SFT data
//   trainctl data batches SPEC.pb.txt [--split val|train] [--step N] [--world N]
//                                                      what a job's ranks read, as JSON
#ifndef WEFT_TRAINCTL_TRAINCTL_DATA_H_
#define WEFT_TRAINCTL_TRAINCTL_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "trainctl/data_prepare.h"

namespace weft {

class DataCommands {
 public:
  // Adds `data` and its subcommands to `app`; their arguments land in this object, which must
  // outlive app.parse().
  explicit DataCommands(CLI::App* app);

  // True if app.parse() chose one of these subcommands.
  bool Parsed() const;

  // Runs the chosen subcommand; `json` selects -o json. Returns the process exit status
  // (errors printed as "trainctl: <message>").
  int Run(bool json) const;

 private:
  int TrainTokenizer(bool json) const;
  int TrainBpe(bool json) const;
  // train-tokenizer's INPUTS read as documents (--jsonl-field, --doc-separator), and their bytes.
  struct TrainingText {
    std::vector<std::string> documents;
    int64_t bytes = 0;
  };
  absl::StatusOr<TrainingText> ReadTrainingText() const;
  int Prepare(bool json) const;
  int Batches() const;

  CLI::App* train_tokenizer_ = nullptr;
  CLI::App* prepare_ = nullptr;
  CLI::App* batches_ = nullptr;

  // Shared by both subcommands.
  std::vector<std::string> inputs_;
  std::string out_;
  std::string jsonl_field_ = "text";
  std::string doc_separator_;
  int threads_ = 0;
  bool quiet_ = false;

  // train-tokenizer
  int vocab_size_ = 0;
  std::string kind_ = "sentencepiece";
  std::string model_type_ = "bpe";
  double character_coverage_ = 0.9995;
  // train-tokenizer --kind tokenizer.json
  std::string style_ = "llama3";
  std::vector<std::string> specials_;
  std::string bos_;
  std::string eos_;
  int64_t min_frequency_ = 2;

  // prepare
  std::string tokenizer_;
  bool bytes_ = false;
  double val_fraction_ = 0.01;
  uint64_t seed_ = 0;
  int64_t shard_tokens_ = 0;
  bool force_ = false;
  bool chat_ = false;
  std::string chat_template_;
  std::string loss_mask_ = "assistant";

  // batches
  std::string spec_path_;
  std::string split_ = "val";
  int64_t step_ = 0;
  int world_ = 0;
};

}  // namespace weft

#endif  // WEFT_TRAINCTL_TRAINCTL_DATA_H_
