// The wire formats of the compressed all-reduce (worker/comm/wire_codec.h, which states the
// layout), without dependencies: the CUDA kernels of the same layout include it too.
#ifndef WEFT_WORKER_COMM_WIRE_FORMAT_H_
#define WEFT_WORKER_COMM_WIRE_FORMAT_H_

#include <cstddef>

namespace weft::comm {

enum class WireFormat { kFp32, kBf16, kInt8 };

// Values per int8 block (one scale each), and the unit chunks are rounded up to.
inline constexpr size_t kWireBlock = 256;

}  // namespace weft::comm

#endif  // WEFT_WORKER_COMM_WIRE_FORMAT_H_
