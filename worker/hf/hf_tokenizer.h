// A Weft tokenizer (worker/data/tokenizer.h) as the Hugging Face tokenizer files of an export,
// so that transformers makes text from the exported directory alone, through its fast
// tokenizer (the `tokenizers` library; sentencepiece need not be installed):
//   tokenizer.json           the tokenizer itself:
//     sentencepiece unigram: a Unigram model of the pieces with their scores, in id order;
//     sentencepiece BPE:     a BPE model of the pieces, merges derived from them (a pair of
//                            pieces whose concatenation is a piece, ranked by that piece's
//                            score, as SentencePiece's own BPE merges the best-scored pair);
//     either: the normalizer SentencePiece's settings imply (its compiled character map,
//       extra whitespace removed, a "▁" before the text, spaces as "▁"), no pre-tokenizer
//       (SentencePiece segments the whole text), byte fallback as the model has it, and a
//       decoder undoing it all; unknown and control pieces are special added tokens,
//       user-defined pieces plain added tokens;
//     bytes: byte-level, 256 tokens, id = byte value;
//     tokenizer.json (a Hugging Face byte-level BPE brought in as such): its own bytes;
//   tokenizer_config.json    tokenizer_class PreTrainedTokenizerFast, the special tokens;
//   special_tokens_map.json  the special tokens.
// Nothing adds BOS or EOS around encoded text: a Weft job trains on documents as they are.
// SentencePiece word and char models, and models that put "▁" after words
// (treat_whitespace_as_suffix), are refused (FAILED_PRECONDITION naming the setting).
//
// What may differ from SentencePiece: text spelling a special piece ("</s>") encodes as that
// token, as every transformers tokenizer does, where SentencePiece spells it out; a unigram
// text with two segmentations of exactly the same score may break the tie the other way.
#ifndef WEFT_WORKER_HF_HF_TOKENIZER_H_
#define WEFT_WORKER_HF_HF_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/tokenizer.h"

namespace weft::hf {

// The special token ids of config.json and generation_config.json; -1 is written as null.
struct HfTokenIds {
  int bos_id = -1;
  int eos_id = -1;
  int pad_id = -1;
};

struct HfTokenizerFiles {
  HfTokenIds ids;
  // (file name, contents), in the order written.
  std::vector<std::pair<std::string, std::string>> files;
};

inline constexpr char kHfTokenizerFile[] = "tokenizer.json";
inline constexpr char kHfTokenizerConfigFile[] = "tokenizer_config.json";
inline constexpr char kHfSpecialTokensFile[] = "special_tokens_map.json";
inline constexpr char kHfGenerationConfigFile[] = "generation_config.json";

// The files of `tokenizer`; `model_max_length` (the model's context length) goes into
// tokenizer_config.json. Errors: the refusals above; a SentencePiece model that does not load.
absl::StatusOr<HfTokenizerFiles> HfTokenizerFilesFor(const data::Tokenizer& tokenizer,
                                                      int64_t model_max_length);

// The BPE merges of a SentencePiece BPE model, best first: every split (at a character
// boundary) of a normal piece into two normal pieces, ranked by the whole piece's score (then
// by its id and the left part's id, so the order is total).
std::vector<std::pair<std::string, std::string>> BpeMergesOf(
    const data::SentencePieceModelInfo& model);

// generation_config.json for `ids`.
std::string HfGenerationConfigJson(const HfTokenIds& ids);

}  // namespace weft::hf

#endif  // WEFT_WORKER_HF_HF_TOKENIZER_H_
