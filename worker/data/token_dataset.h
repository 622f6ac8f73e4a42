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
// A split is a list of token files ("shards"): train_path or val_path may name one file, a
// directory or a glob (worker/data/token_files.h), or manifest_path a prepared dataset
// (worker/data/manifest.h) whose "train" and "val" shards are the two splits. The shards of a
// split are read as one stream, in order.
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
#include <vector>

#include "absl/status/statusor.h"
#include "weft/v1/job.pb.h"

namespace weft::data {

enum class Split { kTrain, kVal };

// "train" or "validation", for messages.
const char* SplitName(Split split);

// An open, validated, read-only view of one split's tokens. Immutable after Open, so Batch may
// be called from any number of threads at once. The files must not be truncated or rewritten
// while the dataset is open (as with any mmap reader, shrinking one under us would fault);
// Weft's data files are written once before a job starts.
class TokenDataset {
 public:
  struct Options {
    int vocab_size = 0;  // the model's: every token must be below it
    int seq_len = 0;     // tokens a sequence (each read with one extra token, the last target)
    // Micro-steps a step (training.grad_accum_steps): SEQUENTIAL numbers the sequences of a
    // run across them.
    int grad_accum_steps = 1;
  };

  // Opens `split` of `spec`.
  //
  // Which tokens: with a manifest, its "train" or "val" shards (an empty "val" is an error for
  // kVal: the caller opens kVal only when validation is on). Otherwise, with a non-empty
  // val_path, kTrain is all of train_path's files and kVal all of val_path's. With an empty
  // val_path, the stream of train_path's files is split at a token boundary: kVal is its last
  // floor(num_tokens * val_fraction) tokens (from the end of the last file, reaching into
  // earlier ones if need be) and kTrain everything before them, so no training sequence ever
  // reads a validation token. val_fraction 0 means the documented default 0.1 (as
  // ApplyJobSpecDefaults would set it).
  //
  // Every token is checked to be < vocab_size, in one vectorised pass at open, which for a
  // manifest also computes each shard's crc32c. kTrain checks all its files whole, a held-out
  // tail included, so a bad validation token fails the job at start rather than at its first
  // evaluation; a held-out kVal checks only its own tail (already covered by kTrain), so a
  // worker opening both reads a large file once. The scan is skipped when the format cannot
  // hold a token that large (bytes with vocab_size >= 256, uint16 with vocab_size 65536) and
  // there is no checksum to compute.
  //
  // Errors, each naming the file (and for a manifest, the field) and saying what is wrong:
  //  - INVALID_ARGUMENT: the arguments themselves are wrong (a spec that validation should have
  //    rejected): seq_len < 1, vocab_size < 1, grad_accum_steps < 1, format UNSPECIFIED or
  //    unknown, val_fraction outside [0, 0.5], empty train_path and manifest_path.
  //  - NOT_FOUND: the file (or the manifest) does not exist, or a glob matches nothing.
  //  - FAILED_PRECONDITION: the files exist but cannot serve the job; the job cannot run until
  //    someone fixes them (or the spec), so retrying is pointless: not a regular file,
  //    unreadable (open/mmap failed), empty, .bin header truncated, bad magic (or the other
  //    .bin width's magic: the format to set is named), bad version, size not matching the
  //    header's count (both numbers given), a token >= vocab_size (value, index in the file
  //    and vocab_size given), the split too short for one sequence (how many tokens it has and
  //    how many it needs; SEQUENTIAL: no file holding one window); a directory without files;
  //    for a manifest: anything ReadManifest refuses, a shard missing, a shard whose size,
  //    token count or crc32c differs from the manifest ("changed after its manifest was
  //    written", both values given), a shard of the other token width, the tokenizer's
  //    vocabulary larger than vocab_size (both named), the tokenizer file changed, no "val"
  //    shards for kVal.
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(const weft::v1::DataSpec& spec,
                                                            const Options& options, Split split);
  // The same with grad_accum_steps 1.
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
  // How Batch draws sequences: spec.data().sampling for kTrain (UNSPECIFIED read as
  // RANDOM_WINDOWS); for kVal PACKED when training is PACKED, else RANDOM_WINDOWS.
  weft::v1::DataSpec::Sampling sampling() const { return sampling_; }
  // What the split reads, as the spec names it: the file, directory or glob, or the manifest.
  const std::string& path() const { return path_; }
  // Index, in the stream of all the named files' tokens, of this split's first token (0 unless
  // this is the held-out tail of train_path).
  int64_t first_token_index() const { return first_token_index_; }
  // The files this split reads tokens from, in stream order.
  int num_files() const { return static_cast<int>(shards_.size()); }
  const std::string& file(int i) const { return shards_[i].path; }
  // SEQUENTIAL: the windows one epoch visits (see SequentialStart).
  int64_t num_windows() const { return num_windows_; }

  // The i-th token of this split; requires 0 <= i < num_tokens().
  int32_t Token(int64_t i) const;

  // Fills one micro-batch of `batch_size` sequences: inputs[b * seq_len + t] is token
  // start_b + t and targets[b * seq_len + t] is token start_b + t + 1 (both row-major
  // (batch_size, seq_len), caller-owned, batch_size * seq_len elements each).
  //
  // The global batch of one micro-step is world_size * batch_size sequences and this rank's
  // rows are global indices g in [rank * batch_size, (rank + 1) * batch_size). start_b is
  // SequenceStart(seed, step, micro_step, g) for RANDOM_WINDOWS and SequentialStart(seed,
  // ((step * grad_accum_steps + micro_step) * world_size * batch_size + g) for SEQUENTIAL.
  // Either depends on rank and world size only through g, so a single process with
  // batch_size * world reads exactly the rows that `world` ranks read together, in rank order.
  //
  // Requires 0 <= rank < world_size, batch_size >= 1, step >= 0, 0 <= micro_step (checked
  // only in debug builds: this is the training hot path, and its caller derives these from
  // a validated spec and rendezvous). Use different seeds for train and validation if the
  // two must not share sampling positions; they never share tokens either way.
  //
  // Loss masks and documents (docs/data.md): a target whose token's flags clear
  // kTokenFlagLoss (worker/data/token_flags.h) is -1, ignored; with document masking so is one
  // that begins a document (it would be predicted across the boundary). With doc_starts
  // (caller-owned (batch_size, seq_len), may be null), doc_starts[b, t] is where t's document
  // begins in the row (the row's first document begins at 0, wherever it began in the stream).
  // PACKED: row g is packed window PermutedWindow(seed, n) (n counted as SEQUENTIAL's);
  // positions past its tokens are padding (input the EOS id or 0, target -1, one document).
  void Batch(uint64_t seed, int64_t step, int micro_step, int rank, int world_size, int batch_size,
             int32_t* inputs, int32_t* targets, int32_t* doc_starts = nullptr) const;

  // RANDOM_WINDOWS: the start token of global sequence `global_index` of a micro-step,
  // HashCombine-chain(seed, step, micro_step, global_index) mod (num_tokens - seq_len): any
  // offset, drawn with replacement (two rows may coincide, with probability ~ rows^2 /
  // num_tokens); a window may run from one file into the next, as the stream does.
  int64_t SequenceStart(uint64_t seed, int64_t step, int micro_step, int64_t global_index) const;

  // SEQUENTIAL: the start token of sequence n of the run (n counts sequences from step 0,
  // micro-step 0, global index 0). Each file is cut into windows of seq_len + 1 tokens at a
  // stride of seq_len: window w of a file covers its tokens [w * seq_len, (w + 1) * seq_len],
  // so consecutive windows share one token (the last target of one is the first input of the
  // next), and the file's tail shorter than a window is never read; no window spans two
  // files. Epoch e = n / num_windows visits every window exactly once: position n % num_windows
  // of a KeyedPermutation of all the split's windows keyed by (seed, e), so the order of both
  // files and windows changes every epoch and with the seed.
  int64_t SequentialStart(uint64_t seed, int64_t n) const;

  // SEQUENTIAL and PACKED: window n % num_windows() of the permutation of epoch
  // n / num_windows() keyed by the seed.
  int64_t PermutedWindow(uint64_t seed, int64_t n) const;

  // The flags of split token i (token_flags.h): its file's, or without one, every token a
  // target and a document begun by the split's first token and each token after an EOS
  // separator.
  uint8_t Flags(int64_t i) const;
  // Whether targets may be ignored or documents known: token flags, or document masking on.
  bool has_flags() const { return has_flags_; }
  // PACKED: window w's tokens [begin, begin + length), length <= seq_len + 1.
  struct PackedWindow {
    int64_t begin = 0;
    int32_t length = 0;
  };
  const std::vector<PackedWindow>& packed_windows() const { return packed_; }

 private:
  // One file's part of the split.
  struct Shard {
    std::string path;
    void* map_base = nullptr;  // the whole file's mapping, owned by the dataset
    size_t map_size = 0;
    const unsigned char* tokens = nullptr;  // the split's first token in this file
    int64_t count = 0;                      // the split's tokens in this file
    int64_t begin = 0;                      // index in the split of tokens[0]
    int64_t first_window = 0;  // index among the split's windows of this file's first
    // The file's token flags (token_flags.h) for tokens[0], and their file's mapping; null
    // without.
    const unsigned char* flags = nullptr;
    void* flags_map_base = nullptr;
    size_t flags_map_size = 0;
  };

  TokenDataset() = default;
  // The shard holding split token `i`.
  const Shard& ShardOfToken(int64_t i) const;
  // Split tokens [begin, begin + n) into out: one run where one shard holds them.
  void ReadTokens(int64_t begin, int64_t n, int32_t* out) const;
  // Copies the window starting at split token `start` into one row of a batch.
  void CopyWindow(int64_t start, int32_t* inputs, int32_t* targets) const;
  // PACKED: packed window `window` into one row.
  void CopyPackedWindow(int64_t window, int32_t* inputs, int32_t* targets,
                        int32_t* doc_starts) const;
  // Applies the flags of a row's n tokens (n - 1 <= seq_len targets) to its targets and, when
  // not null, fills its doc_starts.
  void MaskRow(const uint8_t* flags, int n, int32_t* targets, int32_t* doc_starts) const;
  // The flags of tokens [start, start + n) into out (n bytes): a copy where one shard holds
  // them; with EOS separators, read off the row's inputs (start + t for t < n - 1).
  void RowFlags(int64_t start, int n, const int32_t* inputs, uint8_t* out) const;
  // PACKED: the windows of whole documents (the sampling's description in job.proto).
  void PackDocuments();

  std::string path_;
  Split split_ = Split::kTrain;
  weft::v1::DataSpec::Sampling sampling_ = weft::v1::DataSpec::RANDOM_WINDOWS;
  int seq_len_ = 0;
  int grad_accum_steps_ = 1;
  int token_bytes_ = 1;  // 1 (TEXT_BYTES), 2 (UINT16_BIN) or 4 (UINT32_BIN)
  int64_t num_tokens_ = 0;
  int64_t first_token_index_ = 0;
  int64_t num_windows_ = 0;
  std::vector<Shard> shards_;  // the files holding this split's tokens, in stream order
  bool has_flags_ = false;
  bool document_masking_ = false;
  int32_t eos_id_ = -1;    // the manifest's separator: a document starts after it; -1 none
  int32_t pad_token_ = 0;  // PACKED padding's input
  std::vector<PackedWindow> packed_;
};

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_TOKEN_DATASET_H_
