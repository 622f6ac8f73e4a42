#include "common/utf8.h"

#include <algorithm>

namespace weft {
namespace {

constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
constexpr absl::string_view kEllipsis = "\xE2\x80\xA6";     // U+2026

}  // namespace

size_t Utf8SequenceLength(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  const size_t left = text.size() - i;
  const auto cont = [&](size_t k) { return k < left && (byte(i + k) & 0xC0) == 0x80; };
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    const unsigned char b1 = byte(i + 1);
    if (b0 == 0xE0 && b1 < 0xA0) return 0;   // overlong
    if (b0 == 0xED && b1 >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    const unsigned char b1 = byte(i + 1);
    if (b0 == 0xF0 && b1 < 0x90) return 0;   // overlong
    if (b0 == 0xF4 && b1 >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

namespace {

// At text[i], where no well-formed sequence starts: how many bytes the maximal invalid subpart
// spans (at least 1): the lead byte and the continuation bytes that could still have begun a
// well-formed sequence.
size_t InvalidSubpartLength(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t k = 1;
  for (; k < need && i + k < text.size(); ++k) {
    const unsigned char b = byte(i + k);
    const bool ok = k == 1 ? b >= lo && b <= hi : (b & 0xC0) == 0x80;
    if (!ok) break;
  }
  return k;
}

}  // namespace

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string ReplaceInvalidUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8SequenceLength(text, i);
    if (length > 0) {
      out.append(text.data() + i, length);
      i += length;
    } else {
      out.append(kReplacement.data(), kReplacement.size());
      i += InvalidSubpartLength(text, i);
    }
  }
  return out;
}

std::string ValidUtf8(absl::string_view text, size_t max_bytes) {
  max_bytes = std::max<size_t>(max_bytes, kEllipsis.size() + 1);
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8SequenceLength(text, i);
    const absl::string_view piece = length > 0 ? text.substr(i, length) : kReplacement;
    // Room for the ellipsis is kept until the last character is known to fit.
    const bool last = i + std::max<size_t>(length, 1) >= text.size();
    if (out.size() + piece.size() + (last ? 0 : kEllipsis.size()) > max_bytes) {
      out.append(kEllipsis.data(), kEllipsis.size());
      return out;
    }
    out.append(piece.data(), piece.size());
    i += std::max<size_t>(length, 1);
  }
  return out;
}

}  // namespace weft
