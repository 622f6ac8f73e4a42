// Trains a byte-level BPE tokenizer and writes it as a Hugging Face tokenizer.json that
// bpe_tokenizer.h (and the `tokenizers` library) reads, with a tokenizer_config.json naming
// its BOS and EOS.
//
// The text is cut exactly as the trained tokenizer will cut it when encoding: invalid UTF-8
// replaced (one U+FFFD per maximal invalid subpart), the special tokens taken out whole, the
// rest normalized (NFC for qwen2) and split by the style's pattern (SplitPattern, PCRE2). Each
// distinct pre-token becomes a word of byte tokens, counted. Then merges are learned greedily:
// every step joins the adjacent pair of tokens seen most often over all words (each adjacent
// position counts, times the word's count; "aaa" holds the pair (a, a) twice), at every
// occurrence of it, left to right, until the vocabulary is full or no pair is seen
// min_frequency times.
//
// Ties: among pairs seen equally often the one with the smaller left token id wins, then the
// smaller right token id. Ids are the file's: the 256 byte tokens first, in the order of the
// code points that stand for them (GPT-2's order: '!' is 0), then the learned tokens in the
// order they were learned, then the special tokens. This is the order Hugging Face's
// BpeTrainer breaks ties in, so from the same words both learn the same merges.
//
// Counting runs on `threads` threads over pieces of the text (documents, cut at special tokens
// and, when long, at line breaks where the split is sure to come out the same). The merge loop
// is one thread: a max-heap of pair counts updated lazily (a count only falls, except for
// pairs with the newly made token, which are pushed afresh) and, per pair, the words that hold
// it, so each step touches only the words it changes. The result does not depend on the
// thread count or on where the text is cut.
#ifndef WEFT_WORKER_DATA_BPE_TRAINER_H_
#define WEFT_WORKER_DATA_BPE_TRAINER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace weft::data {

struct BpeTrainOptions {
  // Tokens in the vocabulary, all told: the 256 byte tokens, the learned ones and the special
  // tokens. Text that runs out of pairs first gives a smaller one.
  int vocab_size = 32000;
  // The pre-tokenizer (and normalizer) the file gets, as the model family ships it:
  //   "gpt2"    ByteLevel with GPT-2's split built in (use_regex), no normalizer;
  //   "llama3"  Split on Llama 3's pattern then ByteLevel, no normalizer, ignore_merges (a
  //             pre-token that is itself a token encodes as that token);
  //   "qwen2"   NFC, Split on Qwen2's pattern (every digit alone) then ByteLevel.
  std::string style = "llama3";
  // Added tokens marked special: matched whole in the text before anything else, never split
  // or learned from, decoded to nothing. nullopt: the style's own (BpeStyleSpecialTokens).
  std::optional<std::vector<std::string>> special_tokens;
  // What tokenizer_config.json names as bos_token and eos_token: one of the special tokens,
  // or "" for none. nullopt: the style's choice (BpeStyleBos/Eos) when that token is among the
  // special tokens, else none.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // A pair seen fewer times than this is never merged: one seen once only memorizes a word.
  int64_t min_frequency = 2;
  // Counting threads; 0: one per core. The result is the same for any number.
  int threads = 0;
  // Text is counted in pieces of about this many bytes at most, cut only where the split
  // cannot tell (a line break between a printable ASCII character and a letter), so that one
  // large document keeps every thread busy. Small in tests, to get many pieces.
  int64_t chunk_bytes = int64_t{1} << 20;
  // The training text, document by document (nothing is shared across a document's edge).
  std::vector<std::string> documents;
};

struct BpeTrainResult {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  int vocab_size = 0;  // ids are [0, vocab_size)
  int merges = 0;
  int bos_id = -1;  // -1: none
  int eos_id = -1;
  int64_t words = 0;       // distinct pre-tokens
  int64_t pre_tokens = 0;  // all of them
  int64_t pieces = 0;      // pieces of text counted apart (BpeTrainOptions::chunk_bytes)
  double count_seconds = 0;
  double merge_seconds = 0;
};

// The special tokens, BOS and EOS a style has when the options do not say, as its model
// family has them: gpt2 <|endoftext|> (BOS and EOS); llama3 <|begin_of_text|> (BOS),
// <|end_of_text|> (EOS) and its chat template's <|start_header_id|>, <|end_header_id|>,
// <|eot_id|>; qwen2 <|endoftext|> (EOS, no BOS) and ChatML's <|im_start|>, <|im_end|>. Empty
// for an unknown style.
std::vector<std::string> BpeStyleSpecialTokens(absl::string_view style);
std::string BpeStyleBos(absl::string_view style);
std::string BpeStyleEos(absl::string_view style);

// Trains as the header says. INVALID_ARGUMENT naming the option: an unknown style, a
// vocab_size below 256 plus the special tokens or above 2^24, an empty or repeated special
// token or one that is a single byte's token, a BOS or EOS that is not a special token,
// min_frequency below 1, no text to learn from (no document, or nothing outside the special
// tokens).
absl::StatusOr<BpeTrainResult> TrainBpeTokenizer(const BpeTrainOptions& options);
// The errors TrainBpeTokenizer gives for the options other than `documents`, without training:
// a caller can refuse bad options before it reads the text.
absl::Status CheckBpeTrainOptions(const BpeTrainOptions& options);

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_BPE_TRAINER_H_
