// The tokenizer kinds a job or a prepared dataset names, and which loader reads each: apart
// from tokenizer.cc so that the base (tokenizer.cc, which bpe_tokenizer.cc builds on) does not
// depend on the BPE loader.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/tokenizer.h"

namespace weft::data {

std::string TokenizerKindOfFile(absl::string_view path) {
  return absl::EndsWith(path, ".json") ? "tokenizer.json" : "sentencepiece";
}

std::string TokenizerFileName(absl::string_view kind) {
  return kind == "tokenizer.json" ? "tokenizer.json" : "tokenizer.model";
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFile(const std::string& path) {
  if (TokenizerKindOfFile(path) == "tokenizer.json") return LoadBpeTokenizerFile(path);
  return LoadSentencePieceFile(path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFromBytes(absl::string_view kind,
                                                                  std::string bytes,
                                                                  absl::string_view name,
                                                                  int bos_id, int eos_id) {
  if (kind == "sentencepiece") return LoadSentencePieceFromBytes(std::move(bytes), name);
  if (kind == "tokenizer.json") {
    return LoadBpeTokenizerJson(std::move(bytes), name, BpeSpecialIds{bos_id, eos_id});
  }
  return absl::InvalidArgumentError(absl::StrCat(
      name, ": tokenizer kind \"", kind, "\": not \"sentencepiece\" or \"tokenizer.json\""));
}

}  // namespace weft::data
