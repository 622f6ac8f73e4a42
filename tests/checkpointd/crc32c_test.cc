#include "common/crc32c.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace {

TEST(Crc32cTest, KnownVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(Crc32c(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(digits.data(), digits.size()), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32cPortable(zeros.data(), zeros.size()), 0x8A9136AAu);
  const std::vector<uint8_t> ones(32, 0xFF);
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, StreamingEqualsOneShot) {
  const std::string digits = "123456789";
  for (size_t split = 0; split <= digits.size(); ++split) {
    const uint32_t first = Crc32c(digits.data(), split);
    EXPECT_EQ(Crc32c(digits.data() + split, digits.size() - split, first), 0xE3069283u)
        << split;
    const uint32_t pfirst = Crc32cPortable(digits.data(), split);
    EXPECT_EQ(Crc32cPortable(digits.data() + split, digits.size() - split, pfirst),
              0xE3069283u)
        << split;
  }
}

TEST(Crc32cTest, HardwareMatchesPortableOnRandomData) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(1 << 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (int i = 0; i < 500; ++i) {
    const size_t off = rng() % 64;  // unaligned starts too
    const size_t len = rng() % (buf.size() - off);
    const uint32_t init = static_cast<uint32_t>(rng());
    ASSERT_EQ(Crc32c(buf.data() + off, len, init), Crc32cPortable(buf.data() + off, len, init))
        << "off=" << off << " len=" << len;
  }
  RecordProperty("hardware", Crc32cIsHardwareAccelerated() ? "sse4.2" : "table");
}

}  // namespace
}  // namespace weft
