// Byte-level BPE from a Hugging Face tokenizer.json: the tokenizers of GPT-2, Llama 3, Qwen2/3
// and Mistral-Nemo, read and run in C++ with the same ids the `tokenizers` library gives.
//
// What a file may hold (anything else is refused, FAILED_PRECONDITION naming the JSON path):
//   model          BPE: vocab, merges ("left right" strings or [left, right] pairs, ranked
//                  by order), ignore_merges (a pre-token that is itself in the vocabulary is
//                  that token), no dropout, no unknown token, no subword prefix or suffix;
//   normalizer     none or NFC (a Sequence of those too);
//   pre_tokenizer  ByteLevel (with use_regex: GPT-2's split), or a Sequence of Split
//                  pieces (a Regex or a String, behaviour Isolated, not inverted) then a
//                  ByteLevel without its own split; add_prefix_space either way;
//   added_tokens   matched in the raw text before anything else, longest first where two
//                  start at the same byte; lstrip/rstrip/single_word are refused;
//   decoder        ByteLevel (or none: decoding is byte-level anyway).
//
// Encode: the text's invalid UTF-8 is replaced first, one U+FFFD per maximal invalid subpart
// (common/utf8.h's ReplaceInvalidUtf8, what Python's bytes.decode(errors="replace") does, so a caller holding bytes gets the ids
// the Python library gives for the decoded string). Then the added tokens cut the text; each
// piece between them is normalized, split by the pre-tokenizer's pattern (PCRE2, Unicode
// properties), mapped byte by byte to GPT-2's printable characters, and merged by rank.
// Decode: special added tokens yield nothing; every other token's characters map back to the
// bytes they stand for, and the result is kept as bytes (valid UTF-8 or not). BOS and EOS are
// not in the file: BpeSpecialIds below.
// Immutable after Load: Encode and Decode may run on any number of threads.
#ifndef WEFT_WORKER_DATA_BPE_TOKENIZER_H_
#define WEFT_WORKER_DATA_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/tokenizer.h"

namespace weft::data {

// A tokenizer.json does not say which of its tokens begin and end a document; the
// tokenizer_config.json beside it does (bos_token, eos_token), and a dataset's manifest and a
// model file record the ids. -1: none.
struct BpeSpecialIds {
  int bos_id = -1;
  int eos_id = -1;
};

// The tokenizer.json whose text is `json`, with `special` as its BOS and EOS; `name` (its path,
// or where it came from) labels errors. INVALID_ARGUMENT for text that is not such a JSON
// document or a special id outside the vocabulary, FAILED_PRECONDITION for a file that asks
// for something this reader does not do.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerJson(std::string json,
                                                                 absl::string_view name,
                                                                 BpeSpecialIds special = {});
// The same from a file, its BOS and EOS from the tokenizer_config.json in the same directory
// when there is one (ReadHfSpecialIds): NOT_FOUND if the file does not exist,
// FAILED_PRECONDITION if it is unreadable, and the errors of either file.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerFile(const std::string& path);

// The ids of `config_json`'s bos_token and eos_token (a string, or an object whose "content"
// is one; null or absent: none) in the tokenizer.json `tokenizer_json`, among its added tokens
// or its vocabulary. `config_name` labels errors: INVALID_ARGUMENT for a config that is not
// JSON, FAILED_PRECONDITION naming the field for a token the tokenizer does not have.
absl::StatusOr<BpeSpecialIds> ReadHfSpecialIds(const std::string& config_json,
                                               absl::string_view config_name,
                                               const std::string& tokenizer_json);

// GPT-2's byte-level alphabet, which every ByteLevel (pre-)tokenizer shares: the code point
// standing for byte `b` (0-255) — printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) for themselves, the other 68 for U+0100 on in byte order — and it as UTF-8.
uint32_t ByteLevelCodePoint(int b);
std::string ByteLevelChar(int b);

// The split patterns of the pre-tokenizers Weft knows by name: GPT-2's (which a ByteLevel
// pre-tokenizer with use_regex applies itself), Llama 3's (letters with one leading
// non-letter, numbers in runs of up to three digits, contractions in any case), and Qwen2's
// (Llama 3's with every digit alone). The byte-level BPE trainer (bpe_trainer.h) writes them.
inline constexpr char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr char kLlama3SplitPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr char kQwen2SplitPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A pre-tokenizer's split pattern compiled by PCRE2 (UTF, Unicode properties, JIT): what the
// tokenizer splits text with, shared with the trainer so that both see the same pre-tokens.
// Immutable after Compile: Split may run on any number of threads (each call has its own
// match data).
class SplitPattern {
 public:
  // FAILED_PRECONDITION naming `where` and the offset for a pattern PCRE2 does not compile.
  static absl::StatusOr<std::unique_ptr<SplitPattern>> Compile(const std::string& pattern,
                                                               absl::string_view where);
  ~SplitPattern();
  SplitPattern(const SplitPattern&) = delete;
  SplitPattern& operator=(const SplitPattern&) = delete;

  // Appends the pieces of valid UTF-8 `text` in order, as a Split with behavior Isolated
  // makes them: every match, and every stretch between matches. An empty match yields
  // nothing.
  void Split(absl::string_view text, std::vector<absl::string_view>* pieces) const;

 private:
  explicit SplitPattern(void* code) : code_(code) {}
  void* code_;  // pcre2_code, kept out of this header
};

// Valid UTF-8 `text` in Unicode normalization form C (utf8proc): the normalizer "NFC".
std::string NormalizeNfc(absl::string_view text);

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_BPE_TOKENIZER_H_
