// Tokenizers: text <-> token ids, for `trainctl data prepare` (text in), the trained model's
// file and `trainctl sample` (text out).
//
// Three kinds:
//  - "bytes": every byte is one token (vocabulary 256, no BOS/EOS), the DATA_FORMAT_TEXT_BYTES
//    convention. Any byte string encodes, valid UTF-8 or not.
//  - "sentencepiece": a SentencePiece model (the .model file of spm_train, Llama 2, Mistral),
//    run by Debian's libsentencepiece. Input must be valid UTF-8.
//  - "tokenizer.json": a Hugging Face byte-level BPE (GPT-2, Llama 3, Qwen2/3, Mistral-Nemo),
//    worker/data/bpe_tokenizer.h. Invalid UTF-8 is replaced as Python's decoding does.
//
// Special tokens are explicit: Encode emits BOS/EOS only when EncodeOptions asks, and text
// that spells "<s>" or "</s>" encodes as ordinary characters, never as the control ids. Decode
// drops BOS/EOS (and the other control ids), so a decoded stream reads as its text.
#ifndef WEFT_WORKER_DATA_TOKENIZER_H_
#define WEFT_WORKER_DATA_TOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace weft::data {

// The byte offset of the first byte of `text` that is not part of a well-formed UTF-8
// sequence (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF), or nullopt if all of
// it is valid. A sequence cut off by the end of `text` is invalid at its first byte.
std::optional<size_t> FindInvalidUtf8(absl::string_view text);

struct EncodeOptions {
  bool add_bos = false;  // prepend bos_id (an error if the tokenizer has none)
  bool add_eos = false;  // append eos_id (an error if the tokenizer has none)
};

// Immutable after construction: Encode and Decode may be called from any number of threads.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "bytes", "sentencepiece" or "tokenizer.json" (the manifest's tokenizer.kind).
  virtual absl::string_view kind() const = 0;
  // Ids are in [0, vocab_size).
  virtual int vocab_size() const = 0;
  // -1 when the tokenizer has none.
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  // The serialized model ("" for bytes): what a manifest copies and a model file embeds.
  virtual const std::string& model_bytes() const = 0;
  // CRC32C of model_bytes() (0 for bytes): identifies the model across copies.
  uint32_t fingerprint() const { return fingerprint_; }

  // Appends the ids of `text` to `*ids`. Errors (INVALID_ARGUMENT): text that is not valid
  // UTF-8 for a tokenizer that needs it ("invalid UTF-8 at byte offset N"), add_bos/add_eos
  // without such a token.
  absl::Status EncodeTo(absl::string_view text, std::vector<int32_t>* ids,
                        EncodeOptions options = {}) const;
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              EncodeOptions options = {}) const;

  // The text of `ids`. BOS, EOS and other control ids yield nothing; an id outside
  // [0, vocab_size) (a model whose padded vocabulary is larger sampled past the tokenizer's)
  // yields U+FFFD, so the gap shows rather than failing the whole text. Byte pieces that do
  // not form valid UTF-8 are kept as bytes (bytes) or replaced by U+FFFD (sentencepiece).
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;

 protected:
  explicit Tokenizer(uint32_t fingerprint) : fingerprint_(fingerprint) {}

  // Appends the ids of `text` (already checked as the kind requires), no BOS/EOS.
  virtual absl::Status EncodeBody(absl::string_view text, std::vector<int32_t>* ids) const = 0;
  // Whether EncodeTo must check UTF-8 first.
  virtual bool requires_utf8() const = 0;

 private:
  uint32_t fingerprint_;
};

// Bytes stay bytes: id = byte value.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// A SentencePiece model from its serialized bytes (a .model file's contents); `name` (a path,
// or where the bytes came from) is used in errors. INVALID_ARGUMENT if the bytes are not a
// model SentencePiece can load.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceFromBytes(std::string bytes,
                                                                      absl::string_view name);
// The same from a file: NOT_FOUND if it does not exist, FAILED_PRECONDITION if unreadable.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceFile(const std::string& path);

// A tokenizer file's bytes: NOT_FOUND if it does not exist, FAILED_PRECONDITION if unreadable.
absl::StatusOr<std::string> ReadTokenizerFile(const std::string& path);

// The kind of the tokenizer file at `path`, by its name: "tokenizer.json" for a name ending in
// .json, "sentencepiece" otherwise.
std::string TokenizerKindOfFile(absl::string_view path);
// The file name a dataset or an export keeps a tokenizer of `kind` under: "tokenizer.json" or
// "tokenizer.model".
std::string TokenizerFileName(absl::string_view kind);
// A tokenizer file of either kind (TokenizerKindOfFile), with the errors of its loader (a
// tokenizer.json takes its BOS and EOS from the tokenizer_config.json beside it, if any).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFile(const std::string& path);
// A serialized tokenizer (model_bytes()) of `kind`, "sentencepiece" or "tokenizer.json";
// `name` labels errors. A tokenizer.json takes `bos_id` and `eos_id` (-1: none), which its
// bytes do not hold; a SentencePiece model knows its own. INVALID_ARGUMENT for another kind.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFromBytes(absl::string_view kind,
                                                                  std::string bytes,
                                                                  absl::string_view name,
                                                                  int bos_id = -1,
                                                                  int eos_id = -1);

// What a SentencePiece model is made of, for writing it in another library's format (the
// Hugging Face export, worker/hf/hf_tokenizer.h). The pieces, their scores and kinds and the
// special ids come from libsentencepiece; the settings its API does not expose (model type,
// byte fallback, normalizer) are read from the model's protobuf fields, proto2 defaults where
// a field is absent.
struct SentencePieceModelInfo {
  enum class Type { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };
  enum class PieceKind { kNormal, kUnknown, kControl, kUserDefined, kUnused, kByte };
  struct Piece {
    std::string text;
    float score = 0;
    PieceKind kind = PieceKind::kNormal;
  };
  Type type = Type::kUnigram;
  std::vector<Piece> pieces;  // by id
  int unk_id = -1;  // -1: none
  int bos_id = -1;
  int eos_id = -1;
  int pad_id = -1;
  bool byte_fallback = false;  // characters outside the pieces are spelled as byte pieces
  bool treat_whitespace_as_suffix = false;
  // The normalizer: its rule name ("identity", "nmt_nfkc", ...) and compiled character map
  // (empty for identity), and what it does with whitespace.
  std::string normalizer_name;
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true;          // a space before the text
  bool remove_extra_whitespaces = true;  // leading, trailing and repeated spaces dropped
  bool escape_whitespaces = true;        // spaces become U+2581 ("▁")
};

// The SentencePiece model `model_bytes` (a .model file's contents; `name` labels errors).
// INVALID_ARGUMENT if the bytes are not a model SentencePiece loads.
absl::StatusOr<SentencePieceModelInfo> DescribeSentencePiece(const std::string& model_bytes,
                                                             absl::string_view name);

struct SentencePieceTrainOptions {
  enum class ModelType { kBpe, kUnigram };
  ModelType model_type = ModelType::kBpe;
  int vocab_size = 4096;
  // The training text: documents, each split at newlines into sentences (SentencePiece learns
  // from sentences; newlines themselves become byte-fallback pieces). Must be valid UTF-8.
  std::vector<std::string> documents;
  // Fraction of characters covered by whole-character pieces; the rarest rest are spelled
  // with byte pieces (byte_fallback), so nothing becomes <unk>.
  double character_coverage = 0.9995;
  // Fixed by default so that the same text gives the same model bytes on any machine.
  int num_threads = 1;
  uint32_t seed = 0;
  // Lines longer than this many bytes are left out of training (encoding still covers them).
  int max_sentence_length = 8192;
};

// Ids of the special pieces of a trained model (no PAD).
inline constexpr int kTrainedUnkId = 0;
inline constexpr int kTrainedBosId = 1;
inline constexpr int kTrainedEosId = 2;

// Trains a SentencePiece model (BPE or unigram) and returns its serialized bytes, ready for
// LoadSentencePieceFromBytes or a .model file. The model is lossless for any UTF-8 text:
// identity normalization, whitespace kept as it is, byte_fallback on. unk 0, bos 1, eos 2.
// Deterministic: the same options give the same bytes (no sentence sampling or shuffling, the
// thread count and seed taken from options). INVALID_ARGUMENT for bad options (vocab_size
// outside [kMinTrainedVocab, 1 << 24], no text, invalid UTF-8 naming the document and byte
// offset) and for a vocabulary the text cannot fill (SentencePiece's limit is in the message).
inline constexpr int kMinTrainedVocab = 259 + 4;  // 256 bytes, unk/bos/eos and a few pieces
absl::StatusOr<std::string> TrainSentencePiece(const SentencePieceTrainOptions& options);

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_TOKENIZER_H_
