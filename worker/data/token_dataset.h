// Training and validation tokens, memory-mapped from the files a JobSpec's DataSpec names.
//
// Formats (protos/weft/v1/job.proto, DataFormat):
//  - DATA_FORMAT_TEXT_BYTES: any file; every byte is one token (0..255).
//  - DATA_FORMAT_UINT16_BIN: the llm.c / nanoGPT token file: a header of 256 little-endian
//    int32 ([0] = magic 20240520, [1] = version 1, [2] = token count), then exactly `count`
//    little-endian uint16 tokens and nothing else.
//  - DATA_FORMAT_UINT32_BIN: llm.c's Llama-3 token file: the same 256 x int32 header with
//    [0] = magic 20240801, [1] = version 7, [2] = token count, then exactly `count`
//    little-endian uint32 tokens (for vocabularies past 65,536, e.g. Llama 3's 128,256).
//    The two magics are distinct, so a file of one width opened as the other is named as such.
//
// Batches are a pure function of (seed, step, micro_step, global sample index), so a resumed
// job replays exactly and a job gives the same global batch at any world size (DESIGN.md,
// Data and Determinism).
#ifndef WEFT_WORKER_DATA_TOKEN_DATASET_H_
#define WEFT_WORKER_DATA_TOKEN_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "weft/v1/job.pb.h"

namespace weft::data {

enum class Split { kTrain, kVal };

// "train" or "validation", for messages.
const char* SplitName(Split split);

// An open, validated, read-only view of one split's tokens. Immutable after Open, so Batch may
// be called from any number of threads at once. The file must not be truncated or rewritten
// while the dataset is open (as with any mmap reader, shrinking it under us would fault);
// Weft's data files are written once before a job starts.
class TokenDataset {
 public:
  // Opens `split` of `spec` for sequences of `seq_len` tokens (each read with one extra token,
  // the last target).
  //
  // Which tokens: with a non-empty spec.val_path, kTrain is all of train_path and kVal all of
  // val_path. With an empty val_path, train_path is split at a token boundary: kVal is its last
  // floor(num_tokens * val_fraction) tokens and kTrain everything before them, so no training
  // sequence ever reads a validation token. val_fraction 0 means the documented default 0.1
  // (as ApplyJobSpecDefaults would set it).
  //
  // Every token is checked to be < vocab_size (the model's), in one vectorised pass at open.
  // kTrain checks the whole file, its held-out tail included, so a bad validation token fails
  // the job at start rather than at its first evaluation; a held-out kVal checks only its own
  // tail (already covered by kTrain), so a worker opening both reads a large file once. The
  // scan is skipped when the format cannot hold a token that large (bytes with vocab_size
  // >= 256, uint16 with vocab_size 65536).
  //
  // Errors, each naming the file and saying what is wrong:
  //  - INVALID_ARGUMENT: the arguments themselves are wrong (a spec that validation should have
  //    rejected): seq_len < 1, vocab_size < 1, format UNSPECIFIED or unknown, val_fraction
  //    outside [0, 0.5], empty train_path.
  //  - NOT_FOUND: the file does not exist.
  //  - FAILED_PRECONDITION: the file exists but its contents cannot serve the job; the job
  //    cannot run until someone fixes the file (or the spec), so retrying is pointless:
  //    not a regular file, unreadable (open/mmap failed), empty, .bin header truncated, bad
  //    magic (or the other .bin width's magic: the format to set is named), bad version, size
  //    not matching the header's count (both numbers given), a token >= vocab_size (value,
  //    index in the file and vocab_size given), or the split too short for one sequence (how
  //    many tokens it has and how many it needs).
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(const weft::v1::DataSpec& spec,
                                                            int vocab_size, int seq_len,
                                                            Split split);

  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  // Tokens in this split (>= seq_len + 1).
  int64_t num_tokens() const { return num_tokens_; }
  int seq_len() const { return seq_len_; }
  Split split() const { return split_; }
  // The file this split reads.
  const std::string& path() const { return path_; }
  // Index, among the file's tokens, of this split's first token (0 unless this is the held-out
  // tail of train_path).
  int64_t first_token_index() const { return first_token_index_; }

  // The i-th token of this split; requires 0 <= i < num_tokens().
  int32_t Token(int64_t i) const;

  // Fills one micro-batch of `batch_size` sequences: inputs[b * seq_len + t] is token
  // start_b + t and targets[b * seq_len + t] is token start_b + t + 1 (both row-major
  // (batch_size, seq_len), caller-owned, batch_size * seq_len elements each).
  //
  // The global batch of one micro-step is world_size * batch_size sequences and this rank's
  // rows are global indices [rank * batch_size, (rank + 1) * batch_size). The start of global
  // sequence g is HashCombine-chain(seed, step, micro_step, g) mod (num_tokens - seq_len), so it
  // depends on neither rank nor world size: a single process with batch_size * world reads
  // exactly the rows that `world` ranks read together, in rank order. Samples are drawn with
  // replacement (two rows may coincide, with probability ~ rows^2 / num_tokens).
  //
  // Requires 0 <= rank < world_size, batch_size >= 1, step >= 0, micro_step >= 0 (checked
  // only in debug builds: this is the training hot path, and its caller derives these from
  // a validated spec and rendezvous). Use different seeds for train and validation if the
  // two must not share sampling positions; they never share tokens either way.
  void Batch(uint64_t seed, int64_t step, int micro_step, int rank, int world_size,
             int batch_size, int32_t* inputs, int32_t* targets) const;

  // The start token of global sequence `global_index` (exposed for tests and for logging
  // which data a step saw).
  int64_t SequenceStart(uint64_t seed, int64_t step, int micro_step, int64_t global_index) const;

 private:
  TokenDataset() = default;

  std::string path_;
  Split split_ = Split::kTrain;
  int seq_len_ = 0;
  void* map_base_ = nullptr;  // the whole file's mapping, owned
  size_t map_size_ = 0;
  const unsigned char* tokens_ = nullptr;  // first token of this split, inside the mapping
  int token_bytes_ = 1;                    // 1 (TEXT_BYTES), 2 (UINT16_BIN) or 4 (UINT32_BIN)
  int64_t num_tokens_ = 0;
  int64_t first_token_index_ = 0;
};

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_TOKEN_DATASET_H_
