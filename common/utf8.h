// UTF-8 for text that travels in protobuf string fields: a message with invalid UTF-8 in one
// fails to parse at its receiver, so text of unknown origin (a log line, a file name) is made
// valid before it is sent.
#ifndef WEFT_COMMON_UTF8_H_
#define WEFT_COMMON_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace weft {

// The length of the well-formed UTF-8 sequence that starts at text[i] (1-4), or 0 when none
// does there (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, or a
// sequence cut off by the end). Requires i < text.size().
size_t Utf8SequenceLength(absl::string_view text, size_t i);

// Appends code point `cp` (below U+10000: what Weft writes) as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

// `text` with every maximal invalid subpart (a stray or wrong byte, or the well-formed start of
// a sequence that breaks off) replaced by one U+FFFD: Unicode's recommended practice, and what
// Python's bytes.decode(errors="replace") does.
std::string ReplaceInvalidUtf8(absl::string_view text);

// `text` as valid UTF-8 of at most `max_bytes` bytes (at least 4): each byte that starts no
// well-formed sequence becomes U+FFFD, and text longer than that is cut at a character
// boundary and ends in "…".
std::string ValidUtf8(absl::string_view text, size_t max_bytes);

}  // namespace weft

#endif  // WEFT_COMMON_UTF8_H_
