// Per-token flags beside a token shard: what makes a prepared dataset SFT data (loss masks) and
// where its documents begin (document masking, packing). docs/data.md describes the file.
//
// A flags file mirrors one llm.c token file token for token: a header of 256 little-endian
// int32 ([0] = magic 20261128, [1] = version 1, [2] = token count, equal to its shard's), then
// exactly `count` bytes, byte i the flags of token i:
//   bit 0 (kTokenFlagLoss):     token i counts as a TARGET (the loss predicting it counts);
//                               clear: Hugging Face's labels = -100 for it;
//   bit 1 (kTokenFlagDocStart): token i begins a document (a conversation, an example);
//   bits 2..7: zero (a set one is refused: a newer writer's meaning we do not know).
// A shard without a flags file is read as every token a target and documents found by the
// manifest's document_separator (the token after each EOS begins one) when it has one.
#ifndef WEFT_WORKER_DATA_TOKEN_FLAGS_H_
#define WEFT_WORKER_DATA_TOKEN_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace weft::data {

inline constexpr int32_t kTokenFlagsMagic = 20261128;
inline constexpr int32_t kTokenFlagsVersion = 1;
inline constexpr int kTokenFlagsHeaderBytes = 1024;

inline constexpr uint8_t kTokenFlagLoss = 1;
inline constexpr uint8_t kTokenFlagDocStart = 2;
inline constexpr uint8_t kTokenFlagsKnown = kTokenFlagLoss | kTokenFlagDocStart;

// The file's header for `count` tokens (kTokenFlagsHeaderBytes bytes).
std::string TokenFlagsHeader(int32_t count);

// Checks a whole flags file's bytes as mapped: header (magic, version, the count equal to
// `expected_count`, the size 1024 + count) and no unknown bit set. FAILED_PRECONDITION naming
// `path` and what is wrong (for an unknown bit, its token index).
absl::Status CheckTokenFlags(const unsigned char* data, size_t size, int64_t expected_count,
                             const std::string& path);

// Writes header + flags to `path` (truncating it). The errno-derived code on failure, naming
// the path.
absl::Status WriteTokenFlagsFile(const std::string& path, absl::Span<const uint8_t> flags);

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_TOKEN_FLAGS_H_
