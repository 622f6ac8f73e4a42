// Compressed all-reduce: how a vector of floats is encoded for the wire in the formats of
// JobSpec's sharding.replica_reduce_format, and the all-reduce built from AllToAll and
// AllGather that sums encoded vectors in fp32. The CPU side is here; the CUDA kernels of the
// same layout are worker/engine/cuda/wire_codec.h, and both follow this contract.
//
// Layout. n values reduced over R ranks are cut into R chunks of c = WireChunkValues(n, R)
// values (ceil(n / R) rounded up to kWireBlock): chunk r is values [r c, (r + 1) c), zeros
// past n. A chunk encodes to WireChunkBytes(format, c) bytes:
//   kBf16: c bf16 values, rounded to nearest even.
//   kInt8: c / kWireBlock fp32 scales, then c int8 values. Block b's scale is
//          s = max |x| / 127 over its kWireBlock values and each value is stored as
//          q = rint(x / s) (0 where s is 0), decoded as q * s. A block holding a NaN or an
//          infinity stores s = that max and q = 0: it decodes to NaN, so a non-finite gradient
//          stays non-finite (and the step is skipped) instead of being quantized away.
//
// The all-reduce. Every rank encodes its R chunks; AllToAll sends chunk r to rank r; rank r
// decodes the R versions of its chunk and sums them in rank order in fp32, encodes the sum
// over its own version; an in-place AllGather of the encoded sums; every rank decodes all R.
// A rank sends 2 (R - 1) / R of the encoded vector, a ring all-reduce's traffic at the
// encoding's size, and every rank ends with the same values, bit for bit. The error of a value
// is that of two roundings: its rank's encoding, and the encoding of the sum.
#ifndef WEFT_WORKER_COMM_WIRE_CODEC_H_
#define WEFT_WORKER_COMM_WIRE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/wire_format.h"

namespace weft::comm {

// "fp32" / "bf16" / "int8".
std::string_view WireFormatName(WireFormat format);

// Values per chunk of n values over `ranks`: ceil(n / ranks) rounded up to kWireBlock.
size_t WireChunkValues(size_t n, int ranks);
// Encoded bytes of a chunk of `chunk_values` (a multiple of kWireBlock) values: 4 per value for
// kFp32, 2 for kBf16, 1 plus 4 per block for kInt8.
size_t WireChunkBytes(WireFormat format, size_t chunk_values);
// Both buffers of WireAllReduce of n values over `ranks`: ranks * WireChunkBytes each.
size_t WireBufferBytes(WireFormat format, size_t n, int ranks);

// The first `count` of `values` (count <= chunk_values), zeros after them, as one encoded
// chunk at `out` (WireChunkBytes bytes). Not kFp32.
void EncodeWireChunk(WireFormat format, const float* values, size_t count, size_t chunk_values,
                     uint8_t* out);
// The first `count` values of the chunk at `in`, decoded into `out`.
void DecodeWireChunk(WireFormat format, const uint8_t* in, size_t chunk_values, size_t count,
                     float* out);
// The fp32 sum, in rank order, of the `ranks` encoded chunks at `in` (consecutive, each
// WireChunkBytes), encoded at `out`, which may be one of them.
void SumWireChunks(WireFormat format, const uint8_t* in, int ranks, size_t chunk_values,
                   uint8_t* out);

// values[0, n) summed over `comm` in `format` (not kFp32), in place, as described above;
// blocks until done. `send` and `recv` are scratch, grown to WireBufferBytes. The
// communicator's errors come back as they are.
absl::Status WireAllReduce(Communicator& comm, WireFormat format, float* values, size_t n,
                           std::vector<uint8_t>* send, std::vector<uint8_t>* recv);

// The all-reduce's first half: rank r's chunk of values (elements [r c, (r + 1) c) clipped to
// n, c = WireChunkValues(n, ranks)) ends with the bits WireAllReduce gives it (the sum, encoded
// and decoded); the rest of `values` is left as it was. A rank sends (R - 1) / R of the
// encoded vector.
absl::Status WireReduceScatter(Communicator& comm, WireFormat format, float* values, size_t n,
                               std::vector<uint8_t>* send, std::vector<uint8_t>* recv);

}  // namespace weft::comm

#endif  // WEFT_WORKER_COMM_WIRE_CODEC_H_
