// The stored chunk format on its own; tests/fuzz/checkpoint_chunk_fuzzer.cc throws arbitrary
// bytes at the same decoder.
#include "checkpointd/chunk_codec.h"

#include <string>

#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::checkpointd {
namespace {

using ::testing::HasSubstr;

std::string Encode(const std::string& data) {
  return EncodeChunkValue(data, Crc32c(data.data(), data.size()));
}

TEST(ChunkCodecTest, ChecksumComesFirstLittleEndian) {
  // CRC32C("123456789") = 0xE3069283.
  EXPECT_EQ(Encode("123456789"), std::string("\x83\x92\x06\xE3") + "123456789");
}

TEST(ChunkCodecTest, DecodeReturnsTheDataInPlace) {
  const std::string value = Encode("abcdefgh");
  absl::StatusOr<std::string_view> data = DecodeChunkValue(value, 4, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, "abcdefgh");
  EXPECT_EQ(data->data(), value.data() + kChunkCrcBytes);
}

TEST(ChunkCodecTest, EmptyDataRoundTrips) {
  absl::StatusOr<std::string_view> data = DecodeChunkValue(Encode(""), 2, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->empty());
}

TEST(ChunkCodecTest, BadSizesAreDataLoss) {
  const std::string three_bytes = Encode("abc");
  for (const std::string& value : {std::string(), std::string("\x01\x02\x03"), three_bytes}) {
    absl::StatusOr<std::string_view> data = DecodeChunkValue(value, 2, 0);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << value.size();
    EXPECT_THAT(data.status().message(), HasSubstr("bad size"));
  }
}

TEST(ChunkCodecTest, ChecksumMismatchIsDataLossNamingTheElement) {
  std::string value = Encode("abcdefgh");
  value[6] ^= 1;
  absl::StatusOr<std::string_view> data = DecodeChunkValue(value, 1, 1000);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(data.status().message(), "CRC32C mismatch in the chunk at element 1000");
}

TEST(ChunkCodecTest, ElementSizeBelowOneIsRejected) {
  EXPECT_EQ(DecodeChunkValue(Encode("ab"), 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeChunkValue(Encode("ab"), -4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weft::checkpointd
