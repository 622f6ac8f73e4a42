// `trainctl data prepare`: text files in, a dataset directory out (docs/data.md): token
// shards, the tokenizer and manifest.json (worker/data/manifest.h).
//
// Documents (trainctl/data_inputs.h) are numbered in input order; document i goes to the
// validation split iff a hash of (seed, i) falls below val_fraction, so the split depends on
// neither thread count nor chunking. Each split is one stream of tokens: the documents in order
// with the tokenizer's EOS between consecutive ones (none for bytes, or a model without EOS;
// empty documents contribute nothing), cut into shards of shard_tokens tokens (the last one
// shorter), each an llm.c token file (uint16 when the vocabulary fits, else uint32).
//
// Chat data (chat_template set, `--chat`): every input is JSONL, one conversation a line
// (JsonlConversation in trainctl/data_inputs.h), rendered by the chat template and tokenized
// whole (worker/data/chat_template.h). A conversation is one document, with no separator
// between documents: beside every shard NAME.bin a token flags file NAME.flags
// (worker/data/token_flags.h) marks each conversation's first token (kTokenFlagDocStart) and
// the targets of the loss mask (kTokenFlagLoss), and the manifest (version 2) records the
// template and the mask policy. A conversation may continue into the next shard, whose first
// token then has no document start.
//
// Encoding runs on `threads` threads over chunks of about a MiB of documents while one thread
// writes chunks in order, so the output is byte-identical for any thread count. Nothing
// half-written is visible: everything goes to DIR.tmp-<pid>, renamed to DIR at the end (and
// removed on failure). DIR holding a manifest of the same inputs (paths, sizes, mtimes) and
// options is up to date: nothing is written. Any other existing DIR is refused unless `force`,
// and `force` replaces only another Weft dataset (ForcedReplaceDecision): never an input, a
// directory holding one, or anything that is not a dataset.
#ifndef WEFT_TRAINCTL_DATA_PREPARE_H_
#define WEFT_TRAINCTL_DATA_PREPARE_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "weft/v1/job.pb.h"

namespace weft::dataprep {

enum class Progress {
  kNone,
  kLines,  // a plain line every few seconds (a log, a pipe)
  kBar,    // one line redrawn in place (a terminal)
};

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  std::string tokenizer_path;  // a SentencePiece .model or a tokenizer.json; empty: bytes
  std::string jsonl_field = "text";
  std::string doc_separator;  // empty: a text file is one document
  double val_fraction = 0.01;
  uint64_t seed = 0;
  int64_t shard_tokens = int64_t{1} << 26;
  int threads = 0;  // 0: one per core
  bool force = false;
  // The built-in chat template of chat data (worker/data/chat_template.h); empty: text.
  std::string chat_template;
  std::string loss_mask = "assistant";  // chat data's targets: "assistant" or "all"
  // Text per encoding chunk (the unit of parallel work); small in tests to get many chunks.
  int64_t chunk_bytes = int64_t{1} << 20;
  Progress progress = Progress::kNone;
  FILE* progress_out = stderr;
};

struct PrepareResult {
  bool up_to_date = false;  // DIR already held this dataset; nothing was written
  int64_t input_bytes = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  // Chat data: the tokens flagged as targets (kTokenFlagLoss); 0 for text.
  int64_t train_target_tokens = 0;
  int64_t val_target_tokens = 0;
  int train_shards = 0;
  int val_shards = 0;
  double seconds = 0;
};

// The token file format for a vocabulary: uint16 up to 65,536 ids, uint32 beyond.
// INVALID_ARGUMENT for a vocabulary uint32 cannot hold or no model can have (> 2^24, the bound
// of model.vocab_size).
absl::StatusOr<weft::v1::DataFormat> TokenFormatForVocab(int64_t vocab_size);

// Whether `--force` may replace what already exists at --out, and why not. Pure: the caller
// resolves the paths (canonically, symlinks included) and looks at the filesystem.
struct ForcedReplaceDecision {
  bool replace = false;
  std::string reason;  // why not, when !replace: a clause ("it contains the input /a/b.txt")
};
// `out`: --out's canonical path; `is_directory`, `is_dataset`: what is there (is_dataset: a
// manifest.json whose "format" is "weft-dataset"); `inputs`: the canonical paths of every input
// file and of the tokenizer. Replaced only when `out` is a dataset directory that is neither an
// input nor an ancestor of one.
ForcedReplaceDecision DecideForcedReplace(const std::string& out, bool is_directory,
                                          bool is_dataset, const std::vector<std::string>& inputs);

// Errors name the file (and line) or option at fault: INVALID_ARGUMENT for bad options and bad
// input text (invalid UTF-8, a JSONL line that is not JSON or lacks the field; with chat data an
// unknown template or mask policy, no tokenizer, an input that is not *.jsonl, a line that is
// not a conversation, a conversation the template refuses), NOT_FOUND for a missing input or
// tokenizer, FAILED_PRECONDITION for an empty input file, a tokenizer without the chat
// template's special tokens (naming the token and the tokenizer file), an existing DIR without
// `force` (or with it, one that DecideForcedReplace keeps, naming --out and why; nothing is
// deleted), no training token at all, or, with chat data under "assistant", no target token in
// the training split; the errno-derived code when DIR cannot be written.
absl::StatusOr<PrepareResult> PrepareDataset(const PrepareOptions& options);

}  // namespace weft::dataprep

#endif  // WEFT_TRAINCTL_DATA_PREPARE_H_
