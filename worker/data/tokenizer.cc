#include "worker/data/tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/status.h"
#include "common/utf8.h"
#include "google/protobuf/unknown_field_set.h"
#include "worker/data/sentencepiece_shim.h"


namespace weft::data {
namespace {

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

absl::Status FromShim(const spm::Result& result, absl::string_view context) {
  if (result.code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(result.code),
                      absl::StrCat(context, ": ", result.message));
}

// The SentencePiece shim (sentencepiece_shim.h says why it is loaded, not linked): the file
// $WEFT_SENTENCEPIECE_LIBRARY names, else libweft_sentencepiece.so beside the running program.
absl::StatusOr<const spm::Api*> LoadShim() {
  std::string path;
  if (const char* env = std::getenv("WEFT_SENTENCEPIECE_LIBRARY"); env != nullptr && *env) {
    path = env;
  } else {
    std::error_code error;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
    path = (exe.parent_path() / spm::kShimFileName).string();
  }
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SentencePiece support is missing: cannot load ", path, " (", ::dlerror(),
        "); it is built and installed next to the Weft programs, or named by "
        "WEFT_SENTENCEPIECE_LIBRARY"));
  }
  auto entry = reinterpret_cast<spm::ApiFunction>(::dlsym(handle, spm::kShimEntryPoint));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": no ", spm::kShimEntryPoint, " (a different version?)"));
  }
  return entry();
}

// Loaded once per process and never unloaded (processors may live until exit).
absl::StatusOr<const spm::Api*> Shim() {
  static const absl::StatusOr<const spm::Api*>* const shim =
      new absl::StatusOr<const spm::Api*>(LoadShim());
  return *shim;
}

class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer() : Tokenizer(0) {}

  absl::string_view kind() const override { return "bytes"; }
  int vocab_size() const override { return 256; }
  int bos_id() const override { return -1; }
  int eos_id() const override { return -1; }
  const std::string& model_bytes() const override { return empty_; }

  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) {
        text.push_back(static_cast<char>(id));
      } else {
        text += kReplacementChar;
      }
    }
    return text;
  }

 protected:
  absl::Status EncodeBody(absl::string_view text, std::vector<int32_t>* ids) const override {
    ids->reserve(ids->size() + text.size());
    for (unsigned char c : text) ids->push_back(c);
    return absl::OkStatus();
  }
  bool requires_utf8() const override { return false; }

 private:
  const std::string empty_;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string bytes, std::unique_ptr<spm::Processor> sp)
      : Tokenizer(Crc32c(bytes.data(), bytes.size())),
        bytes_(std::move(bytes)),
        sp_(std::move(sp)) {}

  absl::string_view kind() const override { return "sentencepiece"; }
  int vocab_size() const override { return sp_->piece_size(); }
  int bos_id() const override { return sp_->bos_id(); }
  int eos_id() const override { return sp_->eos_id(); }
  const std::string& model_bytes() const override { return bytes_; }

  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string text;
    std::vector<int> run;
    const auto flush = [&] {
      if (run.empty()) return;
      std::string piece;
      // Every id in the run is in range, the only reason SentencePiece's Decode fails.
      sp_->Decode(run, &piece);
      text += piece;
      run.clear();
    };
    for (int32_t id : ids) {
      if (id >= 0 && id < vocab_size()) {
        run.push_back(id);
      } else {
        flush();
        text += kReplacementChar;
      }
    }
    flush();
    return text;
  }

 protected:
  absl::Status EncodeBody(absl::string_view text, std::vector<int32_t>* ids) const override {
    std::vector<int> out;
    WEFT_RETURN_IF_ERROR(FromShim(sp_->Encode(std::string_view(text.data(), text.size()), &out),
                                  "sentencepiece encode"));
    ids->insert(ids->end(), out.begin(), out.end());
    return absl::OkStatus();
  }
  bool requires_utf8() const override { return true; }

 private:
  const std::string bytes_;
  const std::unique_ptr<spm::Processor> sp_;
};

}  // namespace

std::optional<size_t> FindInvalidUtf8(absl::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    // ASCII runs dominate real text: test eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    const size_t length = Utf8SequenceLength(text, i);
    if (length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

absl::Status Tokenizer::EncodeTo(absl::string_view text, std::vector<int32_t>* ids,
                                 EncodeOptions options) const {
  if ((options.add_bos && bos_id() < 0) || (options.add_eos && eos_id() < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", kind(), " tokenizer has no ", options.add_bos && bos_id() < 0 ? "BOS" : "EOS",
        " token to add"));
  }
  if (requires_utf8()) {
    if (std::optional<size_t> bad = FindInvalidUtf8(text)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "invalid UTF-8 at byte offset %d (byte 0x%02X)", *bad,
          static_cast<unsigned char>(text[*bad])));
    }
  }
  if (options.add_bos) ids->push_back(bos_id());
  WEFT_RETURN_IF_ERROR(EncodeBody(text, ids));
  if (options.add_eos) ids->push_back(eos_id());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       EncodeOptions options) const {
  std::vector<int32_t> ids;
  WEFT_RETURN_IF_ERROR(EncodeTo(text, &ids, options));
  return ids;
}

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceFromBytes(std::string bytes,
                                                                      absl::string_view name) {
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": empty, not a SentencePiece model"));
  }
  WEFT_ASSIGN_OR_RETURN(const spm::Api* shim, Shim());
  std::unique_ptr<spm::Processor> sp;
  const spm::Result loaded = shim->Load(std::string_view(bytes), &sp);
  if (loaded.code != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": not a SentencePiece model that can be loaded: ", loaded.message));
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(bytes), std::move(sp));
}

namespace {

// proto2 fields of sentencepiece_model.proto (ModelProto), by number. libsentencepiece's API
// has no accessor for these and Debian ships no header for the message, so they are read with
// protobuf's schema-less parser.
constexpr int kModelPieces = 1;
constexpr int kModelTrainerSpec = 2;
constexpr int kModelNormalizerSpec = 3;
constexpr int kPieceType = 3;
constexpr uint64_t kPieceTypeUserDefined = 4;
constexpr int kTrainerModelType = 3;
constexpr int kTrainerTreatWhitespaceAsSuffix = 24;
constexpr int kTrainerByteFallback = 35;
constexpr int kNormalizerName = 1;
constexpr int kNormalizerPrecompiledCharsmap = 2;
constexpr int kNormalizerAddDummyPrefix = 3;
constexpr int kNormalizerRemoveExtraWhitespaces = 4;
constexpr int kNormalizerEscapeWhitespaces = 5;

// The last value of field `number` (proto2: the last one wins), or nullptr when absent.
const google::protobuf::UnknownField* LastField(const google::protobuf::UnknownFieldSet& set,
                                                int number) {
  const google::protobuf::UnknownField* found = nullptr;
  for (int i = 0; i < set.field_count(); ++i) {
    if (set.field(i).number() == number) found = &set.field(i);
  }
  return found;
}

uint64_t VarintField(const google::protobuf::UnknownFieldSet& set, int number,
                     uint64_t fallback) {
  const google::protobuf::UnknownField* f = LastField(set, number);
  return f != nullptr && f->type() == google::protobuf::UnknownField::TYPE_VARINT ? f->varint()
                                                                                   : fallback;
}

std::string BytesField(const google::protobuf::UnknownFieldSet& set, int number) {
  const google::protobuf::UnknownField* f = LastField(set, number);
  return f != nullptr && f->type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED
             ? f->length_delimited()
             : std::string();
}

// A nested message field (empty when absent); false if its bytes are not a message.
bool MessageField(const google::protobuf::UnknownFieldSet& set, int number,
                  google::protobuf::UnknownFieldSet* message) {
  const google::protobuf::UnknownField* f = LastField(set, number);
  if (f == nullptr) return true;
  return f->type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
         message->ParseFromString(f->length_delimited());
}

}  // namespace

absl::StatusOr<SentencePieceModelInfo> DescribeSentencePiece(const std::string& model_bytes,
                                                             absl::string_view name) {
  WEFT_ASSIGN_OR_RETURN(const spm::Api* shim, Shim());
  std::unique_ptr<spm::Processor> sp;
  const spm::Result loaded = shim->Load(std::string_view(model_bytes), &sp);
  if (loaded.code != 0 || model_bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": not a SentencePiece model that can be loaded: ", loaded.message));
  }
  SentencePieceModelInfo info;
  using Kind = SentencePieceModelInfo::PieceKind;
  for (spm::Piece& p : sp->Pieces()) {
    const Kind kind = p.kind == spm::Piece::kUnknown   ? Kind::kUnknown
                      : p.kind == spm::Piece::kControl ? Kind::kControl
                      : p.kind == spm::Piece::kUnused  ? Kind::kUnused
                      : p.kind == spm::Piece::kByte    ? Kind::kByte
                                                       : Kind::kNormal;
    info.pieces.push_back({std::move(p.text), p.score, kind});
  }
  info.unk_id = sp->unk_id();
  info.bos_id = sp->bos_id();
  info.eos_id = sp->eos_id();
  info.pad_id = sp->pad_id();

  google::protobuf::UnknownFieldSet model, trainer, normalizer;
  if (!model.ParseFromString(model_bytes) || !MessageField(model, kModelTrainerSpec, &trainer) ||
      !MessageField(model, kModelNormalizerSpec, &normalizer)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": SentencePiece loaded it, but its protobuf fields do not parse"));
  }
  // The library does not tell user-defined pieces (matched verbatim in text) from normal ones.
  size_t index = 0;
  for (int i = 0; i < model.field_count() && index < info.pieces.size(); ++i) {
    if (model.field(i).number() != kModelPieces) continue;
    google::protobuf::UnknownFieldSet piece;
    if (model.field(i).type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
        piece.ParseFromString(model.field(i).length_delimited()) &&
        VarintField(piece, kPieceType, 1) == kPieceTypeUserDefined) {
      info.pieces[index].kind = Kind::kUserDefined;
    }
    ++index;
  }
  const uint64_t type = VarintField(trainer, kTrainerModelType, 1);
  if (type < 1 || type > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": unknown SentencePiece model type ", type));
  }
  info.type = static_cast<SentencePieceModelInfo::Type>(type);
  info.byte_fallback = VarintField(trainer, kTrainerByteFallback, 0) != 0;
  info.treat_whitespace_as_suffix = VarintField(trainer, kTrainerTreatWhitespaceAsSuffix, 0) != 0;
  info.normalizer_name = BytesField(normalizer, kNormalizerName);
  info.precompiled_charsmap = BytesField(normalizer, kNormalizerPrecompiledCharsmap);
  info.add_dummy_prefix = VarintField(normalizer, kNormalizerAddDummyPrefix, 1) != 0;
  info.remove_extra_whitespaces =
      VarintField(normalizer, kNormalizerRemoveExtraWhitespaces, 1) != 0;
  info.escape_whitespaces = VarintField(normalizer, kNormalizerEscapeWhitespaces, 1) != 0;
  return info;
}

absl::StatusOr<std::string> ReadTokenizerFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such tokenizer file"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot open the tokenizer file: ", std::strerror(error)));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": read failed"));
  }
  return std::move(bytes).str();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceFile(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(std::string bytes, ReadTokenizerFile(path));
  return LoadSentencePieceFromBytes(std::move(bytes), path);
}

absl::StatusOr<std::string> TrainSentencePiece(const SentencePieceTrainOptions& options) {
  constexpr int kMaxVocab = 1 << 24;
  if (options.vocab_size < kMinTrainedVocab || options.vocab_size > kMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size ", options.vocab_size, " is outside [", kMinTrainedVocab, ", ", kMaxVocab,
        "] (256 byte pieces, unk, bos, eos and learned pieces)"));
  }
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads ", options.num_threads, " must be >= 1"));
  }
  bool any_text = false;
  for (size_t d = 0; d < options.documents.size(); ++d) {
    const std::string& doc = options.documents[d];
    if (std::optional<size_t> bad = FindInvalidUtf8(doc)) {
      return absl::InvalidArgumentError(
          absl::StrCat("training document ", d, ": invalid UTF-8 at byte offset ", *bad));
    }
    any_text = any_text || doc.find_first_not_of('\n') != std::string::npos;
  }
  if (!any_text) return absl::InvalidArgumentError("no training text");

  WEFT_ASSIGN_OR_RETURN(const spm::Api* shim, Shim());
  const std::vector<std::pair<std::string, std::string>> args = {
      {"model_type", options.model_type == SentencePieceTrainOptions::ModelType::kBpe
                         ? "bpe"
                         : "unigram"},
      {"vocab_size", absl::StrCat(options.vocab_size)},
      {"character_coverage", absl::StrCat(options.character_coverage)},
      {"byte_fallback", "true"},
      // Lossless: text decodes to exactly what was encoded.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", absl::StrCat(kTrainedUnkId)},
      {"bos_id", absl::StrCat(kTrainedBosId)},
      {"eos_id", absl::StrCat(kTrainedEosId)},
      {"pad_id", "-1"},
      // Deterministic: every sentence, in order, a fixed thread count and seed.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", absl::StrCat(options.num_threads)},
      {"max_sentence_length", absl::StrCat(options.max_sentence_length)},
      {"minloglevel", "2"},  // SentencePiece's INFO and WARNING lines would flood stderr
  };
  // Training reads every sentence in order and samples nothing; the seed (a process-wide
  // setting of the library, as spm_train's --random_seed) pins whatever randomness remains.
  std::string model;
  const spm::Result trained = shim->Train(args, options.documents, options.seed, &model);
  if (trained.code != 0) {
    // SentencePiece reports a vocabulary the text cannot fill as an internal check failure;
    // it is the caller's number that is wrong.
    const std::string& message = trained.message;
    if (absl::StrContains(message, "Vocabulary size too high")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vocab_size ", options.vocab_size, " is more than the training text has pieces for: ",
          message.substr(message.find("Vocabulary size too high"))));
    }
    return FromShim(trained, "training the SentencePiece model");
  }
  return model;
}

}  // namespace weft::data
