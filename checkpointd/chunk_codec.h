// The stored form of one tensor chunk: the value under a ckpt/... key (see store.h) is the
// chunk's CRC32C (4 bytes, little-endian) followed by its raw element bytes. Kept apart from
// the store so that the decoder, which reads whatever the disk hands back, can be fuzzed
// without RocksDB.
#ifndef WEFT_CHECKPOINTD_CHUNK_CODEC_H_
#define WEFT_CHECKPOINTD_CHUNK_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace weft::checkpointd {

// Bytes of the checksum that precedes a chunk's data.
inline constexpr size_t kChunkCrcBytes = 4;

// The stored value for `data`, whose CRC32C the caller has already computed as `crc32c`
// (the writer needs it first, to check what the client sent).
std::string EncodeChunkValue(std::string_view data, uint32_t crc32c);

// Checks a stored value: a checksum, then a whole number of `element_size`-byte elements
// whose CRC32C matches it. Returns the element bytes, a view into `value`. DATA_LOSS if the
// value is damaged; `first_element` only labels the checksum error. INVALID_ARGUMENT if
// `element_size` < 1.
absl::StatusOr<std::string_view> DecodeChunkValue(std::string_view value, int element_size,
                                                  int64_t first_element);

}  // namespace weft::checkpointd

#endif  // WEFT_CHECKPOINTD_CHUNK_CODEC_H_
