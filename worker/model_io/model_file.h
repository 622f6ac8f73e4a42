// The trained model as one portable file: safetensors, one tensor per parameter (named as in
// the architecture's unit layout, engine/model_arch.h), with the JobSpec it was trained under and
// the tokenizer of its data in the metadata. Written by rank 0 at the end of a job; read by
// `trainctl sample`.
//
// The tokenizer lives in string metadata, not in a tensor, so every reader of the tensors (the
// Hugging Face export, Python's `safetensors`, transformers) sees the model's parameters only:
//   weft.tokenizer.kind    "bytes", "sentencepiece" or "tokenizer.json"; absent: none
//                          recorded (the model reads and writes token ids), except that a file
//                          of a vocabulary of 256 written before tokenizers were recorded is
//                          read as bytes
//   weft.tokenizer.model   not bytes: the .model file's or the tokenizer.json's bytes, base64
//                          (RFC 4648)
//   weft.tokenizer.crc32c  not bytes: the model bytes' CRC32C, "0x" and 8 hex digits (the
//                          tokenizer's fingerprint, as in a dataset manifest)
//   weft.tokenizer.bos_id, weft.tokenizer.eos_id
//                          tokenizer.json only, when it has them: the ids, in decimal
//   weft.chat.template     the name of the chat template (worker/data/chat_template.h) the
//                          job's conversations were rendered with: its manifest's
//                          chat.template, for data made by `trainctl data prepare --chat`;
//                          absent otherwise. `trainctl sample --chat` renders prompts with it.
#ifndef WEFT_WORKER_MODEL_IO_MODEL_FILE_H_
#define WEFT_WORKER_MODEL_IO_MODEL_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/model_io/safetensors.h"
#include "worker/data/tokenizer.h"
#include "worker/engine/model_arch.h"
#include "weft/v1/job.pb.h"

namespace weft::model_io {

// The tokenizer a job's tokens were made with, read when the job starts so that a missing or
// changed file fails it before training: the manifest's (data.manifest_path), else
// data.tokenizer_path's SentencePiece model, else bytes for DATA_FORMAT_TEXT_BYTES or a
// vocabulary of 256; nullptr otherwise (token ids in and out). FAILED_PRECONDITION or NOT_FOUND
// naming the field and the file: unreadable or not a SentencePiece model, a manifest's tokenizer
// that differs from what its manifest says (crc32c, vocab_size), data.tokenizer_path with more
// pieces than model.vocab_size or next to DATA_FORMAT_TEXT_BYTES data. (The dataset checks a
// manifest's vocab_size against the model; that is not repeated here.)
absl::StatusOr<std::shared_ptr<const data::Tokenizer>> LoadJobTokenizer(
    const weft::v1::JobSpec& spec);

// The chat template a job's data was rendered with: its manifest's chat.template (empty for a
// manifest of text, or no manifest). ReadManifest's errors, annotated with data.manifest_path.
absl::StatusOr<std::string> LoadJobChatTemplate(const weft::v1::JobSpec& spec);

// The metadata entries that record `tokenizer` in a model file (none for null: no tokenizer
// recorded); INVALID_ARGUMENT if its vocabulary is larger than the model's.
absl::StatusOr<std::map<std::string, std::string>> TokenizerMetadata(
    const data::Tokenizer* tokenizer, int model_vocab_size);

// Everything a model file records of its job's data: TokenizerMetadata's entries and, when
// `chat_template` is not empty, weft.chat.template. TokenizerMetadata's errors.
absl::StatusOr<std::map<std::string, std::string>> ModelFileMetadata(
    const data::Tokenizer* tokenizer, int model_vocab_size, const std::string& chat_template);

// `units`: every unit's full (unpadded) parameters, in unit order, written through
// ModelFileWriter. `tokenizer` (may be null: none recorded) and `chat_template` (empty: none)
// go into the metadata; INVALID_ARGUMENT if the tokenizer's vocabulary is larger than the
// model's.
absl::Status SaveModel(const std::string& path, const weft::v1::JobSpec& spec,
                       const std::vector<std::vector<float>>& units,
                       const data::Tokenizer* tokenizer = nullptr,
                       const std::string& chat_template = "");

// SaveModel's file written a unit at a time, so that the writer holds one unit, never the whole
// model: Begin announces every tensor (the header's offsets come from the architecture's
// tensor tables, before any data), WriteUnit appends unit 0, 1, ... in order, Commit makes the
// file appear under `path`. Until then the bytes live in a temporary file beside `path` (removed
// if the writer is destroyed uncommitted), so a reader never sees a partial model. The bytes
// equal SaveModel's for the same parameters.
class ModelFileWriter {
 public:
  // `extra_metadata`: entries written next to the JobSpec and the format tag (a key of theirs
  // is refused: INVALID_ARGUMENT). Errors: a spec no architecture takes, or the file's
  // (data::SafetensorsWriter::Begin).
  static absl::StatusOr<std::unique_ptr<ModelFileWriter>> Begin(
      const std::string& path, const weft::v1::JobSpec& spec,
      const std::map<std::string, std::string>& extra_metadata = {});

  // Unit `params` (its UnitSize unpadded floats) as the next unit. FAILED_PRECONDITION for a
  // unit out of order or of the wrong size; a failed write is the file's error.
  absl::Status WriteUnit(int unit, const std::vector<float>& params);
  // FAILED_PRECONDITION until every unit was written.
  absl::Status Commit();

 private:
  ModelFileWriter() = default;

  std::string path_;
  std::unique_ptr<const engine::ModelArch> arch_;
  std::unique_ptr<SafetensorsWriter> file_;
  int next_unit_ = 0;
};

struct LoadedModel {
  weft::v1::JobSpec spec;
  std::shared_ptr<const engine::ModelArch> arch;
  std::vector<std::vector<float>> units;
  // Null when the file records none: GenerateText then speaks token ids.
  std::shared_ptr<const data::Tokenizer> tokenizer;
  // weft.chat.template as recorded (empty: none). Not checked against the built-in templates
  // here: a name this build does not know must not stop plain sampling, only a chat.
  std::string chat_template;
};

// Errors name the file: unreadable, not safetensors, no weft.job_spec metadata, a model spec no
// architecture takes, a tensor missing or of the wrong shape (INVALID_ARGUMENT); a tokenizer
// entry of an unknown kind, not base64, whose bytes are not a tokenizer of its kind or differ from
// their crc32c, or with more pieces than the model's vocabulary (DATA_LOSS, naming the key).
absl::StatusOr<LoadedModel> LoadModel(const std::string& path);

// How far one tensor of a model is from the same tensor of another.
struct TensorDifference {
  std::string name;
  size_t elements = 0;
  size_t differing = 0;  // elements whose bits differ
  double max_abs = 0;    // largest |a - b|
  double relative = 0;   // ||a - b|| / ||b|| (L2); 0 when identical, inf when b is all zeros
};

struct ModelDifference {
  size_t elements = 0;
  size_t differing = 0;
  double max_abs = 0;
  // ||a - b|| / ||b|| over every parameter: the summary a tolerance is judged by, since a
  // tensor of near-zero values (a key bias, whose exact gradient is zero) can differ by a
  // large share of itself while the model does not.
  double relative = 0;
  double max_relative = 0;                 // the largest tensor's `relative`
  std::vector<TensorDifference> tensors;   // the tensors that differ, in layout order
  bool identical() const { return differing == 0; }
};

// `a` against `b`, tensor by tensor of the architecture's layout, bit for bit (a NaN equals
// only the same NaN). Models of different architectures or shapes are not compared:
// INVALID_ARGUMENT naming the first field or tensor that differs. What `trainctl model diff`
// prints: a resumed run against an uninterrupted one, one world size against another.
absl::StatusOr<ModelDifference> CompareModels(const LoadedModel& a, const LoadedModel& b);

// The model's logits for `tokens` (one sequence, 1 <= length <= context): (T, vocab_size)
// row-major, padding columns left out. INVALID_ARGUMENT for an empty or too long sequence or an
// id outside [0, vocab_size). What `trainctl model logits` prints, to compare with another
// implementation (tests/fixtures/hf/check_export.py compares it with transformers).
absl::StatusOr<std::vector<float>> ModelLogits(const LoadedModel& model,
                                               const std::vector<int32_t>& tokens);

struct SampleOptions {
  int tokens = 200;
  // 0: always the most likely token.
  float temperature = 0.8f;
  // 0: sample from every token.
  int top_k = 40;
  uint64_t seed = 1;
};

// The ids GenerateTokens sampled after the prompt, and why it stopped.
struct GeneratedTokens {
  std::vector<int32_t> ids;  // without the stop token
  int32_t stop_id = -1;      // the one of `stop_ids` that ended it; -1: options.tokens reached
};

// Samples up to options.tokens ids after `prompt` (ids of the model's vocabulary, at least one)
// among ids [0, vocab), ending before the first of `stop_ids`. The model sees at most its
// context: the most recent tokens. INVALID_ARGUMENT for bad sampling options
// (data::CheckSamplingParams) or an empty prompt.
absl::StatusOr<GeneratedTokens> GenerateTokens(const LoadedModel& model,
                                               absl::Span<const int32_t> prompt,
                                               const SampleOptions& options, int vocab,
                                               absl::Span<const int32_t> stop_ids);

// Continues `prompt` and returns the continuation only. With a tokenizer the prompt is text,
// encoded without BOS (a prepared dataset has none: documents are separated by EOS, so an empty
// prompt starts after an EOS, as a document does), and the output is the decoded text of the
// sampled ids, drawn from the tokenizer's vocabulary only and ending before the first EOS.
// Without one, the prompt is whitespace-separated token ids and so is the output.
// INVALID_ARGUMENT for a prompt the tokenizer refuses (invalid UTF-8) or a bad id.
absl::StatusOr<std::string> GenerateText(const LoadedModel& model, const std::string& prompt,
                                         const SampleOptions& options);

}  // namespace weft::model_io

#endif  // WEFT_WORKER_MODEL_IO_MODEL_FILE_H_
