// common/utf8.h's ReplaceInvalidUtf8: one U+FFFD per maximal invalid subpart, as Python's
// bytes.decode(errors="replace") gives (the tokenizer.json reader relies on it to give the
// `tokenizers` library's ids for bytes that are not UTF-8).
#include "common/utf8.h"

#include "gtest/gtest.h"

namespace weft {
namespace {

TEST(ReplaceInvalidUtf8Test, OneReplacementPerMaximalSubpart) {
  EXPECT_EQ(ReplaceInvalidUtf8("ok"), "ok");
  EXPECT_EQ(ReplaceInvalidUtf8("a\x80" "b"), "a\xEF\xBF\xBD" "b");
  // A truncated sequence is one subpart; an overlong lead (C0) and the byte after are two.
  EXPECT_EQ(ReplaceInvalidUtf8("\xE6\x97!"), "\xEF\xBF\xBD!");
  EXPECT_EQ(ReplaceInvalidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // A surrogate (ED A0 80): ED's second byte must be below A0, so three subparts.
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  // Cut at the end.
  EXPECT_EQ(ReplaceInvalidUtf8("x\xF0\x9F\x98"), "x\xEF\xBF\xBD");
}

}  // namespace
}  // namespace weft
