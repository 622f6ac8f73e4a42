#include "checkpointd/chunk_codec.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace weft::checkpointd {

std::string EncodeChunkValue(std::string_view data, uint32_t crc32c) {
  std::string value(kChunkCrcBytes + data.size(), '\0');
  std::memcpy(value.data(), &crc32c, kChunkCrcBytes);  // little-endian hosts only
  if (!data.empty()) std::memcpy(value.data() + kChunkCrcBytes, data.data(), data.size());
  return value;
}

absl::StatusOr<std::string_view> DecodeChunkValue(std::string_view value, int element_size,
                                                  int64_t first_element) {
  if (element_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk element size must be >= 1, got ", element_size));
  }
  if (value.size() < kChunkCrcBytes ||
      (value.size() - kChunkCrcBytes) % static_cast<size_t>(element_size) != 0) {
    return absl::DataLossError("stored chunk has a bad size");
  }
  uint32_t stored_crc;
  std::memcpy(&stored_crc, value.data(), kChunkCrcBytes);
  const std::string_view data = value.substr(kChunkCrcBytes);
  if (Crc32c(data.data(), data.size()) != stored_crc) {
    return absl::DataLossError(
        absl::StrCat("CRC32C mismatch in the chunk at element ", first_element));
  }
  return data;
}

}  // namespace weft::checkpointd
