// The compressed all-reduce's encodings on the GPU: the layout, rounding and non-finite rules
// of worker/comm/wire_codec.h (which the CPU side implements and its contract states), for
// all of a vector's chunks at once. The engine composes them with the replica communicator's
// AllToAll and AllGather on one stream: Encode, AllToAll, Sum, AllGather (in place), Decode.
// `chunk_values` is comm::WireChunkValues(n, ranks) and `chunk_bytes`
// comm::WireChunkBytes(format, chunk_values); format is kBf16 or kInt8.
#ifndef WEFT_WORKER_ENGINE_CUDA_WIRE_CODEC_H_
#define WEFT_WORKER_ENGINE_CUDA_WIRE_CODEC_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/comm/wire_format.h"

namespace weft::engine::cuda {

// values[0, n) (zeros past n, up to ranks * chunk_values) as `ranks` encoded chunks at `out`
// (ranks * chunk_bytes).
absl::Status EncodeWireChunks(comm::WireFormat format, const float* values, size_t n, int ranks,
                              size_t chunk_values, size_t chunk_bytes, uint8_t* out,
                              cudaStream_t stream);
// The fp32 sum, in rank order, of the `ranks` chunks at `in`, encoded at `out`, which may be
// one of them.
absl::Status SumWireChunks(comm::WireFormat format, const uint8_t* in, int ranks,
                           size_t chunk_values, size_t chunk_bytes, uint8_t* out,
                           cudaStream_t stream);
// The `ranks` chunks at `in` decoded into values[0, n).
absl::Status DecodeWireChunks(comm::WireFormat format, const uint8_t* in, int ranks,
                              size_t chunk_values, size_t chunk_bytes, float* values, size_t n,
                              cudaStream_t stream);

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_WIRE_CODEC_H_
