// Fuzzes DecodeChunkValue, which checkpointd runs on every chunk value RocksDB hands back
// (damaged disks and bugs included). Input: one byte choosing the element size, then the
// stored value. Damaged values must come back as DATA_LOSS, never as a crash or a read past
// the value; intact ones must round-trip through EncodeChunkValue.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpointd/chunk_codec.h"
#include "common/crc32c.h"
#include "tests/fuzz/require.h"

namespace {

using weft::checkpointd::DecodeChunkValue;
using weft::checkpointd::EncodeChunkValue;
using weft::checkpointd::kChunkCrcBytes;
using weft::fuzz::Require;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // 0..7 covers the real dtypes (1, 2, 4 bytes), sizes no dtype has, and the invalid 0.
  const int element_size = data[0] % 8;
  // A view to the end of libFuzzer's exactly-sized buffer: any read past the value is a read
  // past the allocation, which AddressSanitizer reports.
  const std::string_view value(reinterpret_cast<const char*>(data + 1), size - 1);

  // The decoder trusts Crc32c, and Crc32c picks SSE4.2 or the table at run time: both must
  // agree on every input, also when fed in two pieces.
  const uint32_t whole = weft::Crc32c(value.data(), value.size());
  Require(whole == weft::Crc32cPortable(value.data(), value.size()),
          "hardware and table CRC32C agree");
  const size_t split = value.empty() ? 0 : data[0] % value.size();
  Require(whole == weft::Crc32c(value.data() + split, value.size() - split,
                                weft::Crc32c(value.data(), split)),
          "CRC32C streams");

  const absl::StatusOr<std::string_view> decoded =
      DecodeChunkValue(value, element_size, /*first_element=*/0);
  if (element_size == 0) {
    Require(decoded.status().code() == absl::StatusCode::kInvalidArgument,
            "element size 0 is INVALID_ARGUMENT");
    return 0;
  }
  if (!decoded.ok()) {
    Require(decoded.status().code() == absl::StatusCode::kDataLoss,
            "a damaged chunk is DATA_LOSS");
    Require(!decoded.status().message().empty(), "a damaged chunk says why");
    return 0;
  }

  // Accepted: the data is the value minus its checksum, whole elements, and matches the CRC.
  Require(decoded->data() == value.data() + kChunkCrcBytes &&
              decoded->size() + kChunkCrcBytes == value.size(),
          "the data is the value after the checksum");
  Require(decoded->size() % static_cast<size_t>(element_size) == 0, "whole elements");
  uint32_t stored_crc;
  std::memcpy(&stored_crc, value.data(), kChunkCrcBytes);
  Require(weft::Crc32c(decoded->data(), decoded->size()) == stored_crc, "the CRC matches");
  Require(EncodeChunkValue(*decoded, stored_crc) == value, "encode(decode(v)) == v");
  return 0;
}
