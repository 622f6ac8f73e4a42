// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of checkpoint chunks.
#ifndef WEFT_COMMON_CRC32C_H_
#define WEFT_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace weft {

// CRC32C of `size` bytes at `data`. Streamable: Crc32c(b, nb, Crc32c(a, na)) equals the CRC32C
// of a followed by b; `init` 0 starts a new checksum. Uses SSE4.2 when the CPU has it (checked
// once at run time), else a table; both give the same result.
uint32_t Crc32c(const void* data, size_t size, uint32_t init = 0);

// The portable table-driven implementation; exposed so tests can compare it with Crc32c.
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t init = 0);

// True if Crc32c uses the SSE4.2 instruction on this machine.
bool Crc32cIsHardwareAccelerated();

}  // namespace weft

#endif  // WEFT_COMMON_CRC32C_H_
