#include "worker/comm/wire_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/statusor.h"
#include "common/status.h"

namespace weft::comm {
namespace {

uint16_t ToBf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stays a NaN
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

float FromBf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x = 0;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// Where block b's scale and values lie in an int8 chunk of `chunk_values`.
float* Int8Scales(uint8_t* chunk) { return reinterpret_cast<float*>(chunk); }
const float* Int8Scales(const uint8_t* chunk) { return reinterpret_cast<const float*>(chunk); }
size_t Int8ValuesOffset(size_t chunk_values) {
  return chunk_values / kWireBlock * sizeof(float);
}

// One block of kWireBlock values (x) as its scale and int8 values.
void EncodeInt8Block(const float* x, float* scale, int8_t* q) {
  float amax = 0;
  bool finite = true;
  for (size_t i = 0; i < kWireBlock; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::isnan(x[i]) ? x[i] : std::max(amax, std::fabs(x[i]));
    if (std::isnan(amax)) break;
  }
  const float s = finite ? amax / 127.0f : amax;
  *scale = s;
  for (size_t i = 0; i < kWireBlock; ++i) {
    q[i] = (!finite || s == 0.0f)
               ? 0
               : static_cast<int8_t>(std::clamp(std::rint(x[i] / s), -127.0f, 127.0f));
  }
}

// Block `b` of an encoded chunk, decoded into x (kWireBlock values).
void DecodeBlock(WireFormat format, const uint8_t* chunk, size_t chunk_values, size_t b,
                 float* x) {
  if (format == WireFormat::kBf16) {
    const auto* h = reinterpret_cast<const uint16_t*>(chunk) + b * kWireBlock;
    for (size_t i = 0; i < kWireBlock; ++i) x[i] = FromBf16(h[i]);
    return;
  }
  const float s = Int8Scales(chunk)[b];
  const auto* q =
      reinterpret_cast<const int8_t*>(chunk + Int8ValuesOffset(chunk_values)) + b * kWireBlock;
  for (size_t i = 0; i < kWireBlock; ++i) x[i] = static_cast<float>(q[i]) * s;
}

void EncodeBlock(WireFormat format, const float* x, uint8_t* chunk, size_t chunk_values,
                 size_t b) {
  if (format == WireFormat::kBf16) {
    auto* h = reinterpret_cast<uint16_t*>(chunk) + b * kWireBlock;
    for (size_t i = 0; i < kWireBlock; ++i) h[i] = ToBf16(x[i]);
    return;
  }
  auto* q = reinterpret_cast<int8_t*>(chunk + Int8ValuesOffset(chunk_values)) + b * kWireBlock;
  EncodeInt8Block(x, &Int8Scales(chunk)[b], q);
}

}  // namespace

std::string_view WireFormatName(WireFormat format) {
  switch (format) {
    case WireFormat::kFp32: return "fp32";
    case WireFormat::kBf16: return "bf16";
    case WireFormat::kInt8: return "int8";
  }
  return "unknown";
}

size_t WireChunkValues(size_t n, int ranks) {
  const size_t r = static_cast<size_t>(std::max(ranks, 1));
  const size_t per_rank = (n + r - 1) / r;
  return std::max<size_t>(1, (per_rank + kWireBlock - 1) / kWireBlock) * kWireBlock;
}

size_t WireChunkBytes(WireFormat format, size_t chunk_values) {
  switch (format) {
    case WireFormat::kFp32: return chunk_values * 4;
    case WireFormat::kBf16: return chunk_values * 2;
    case WireFormat::kInt8: return chunk_values + Int8ValuesOffset(chunk_values);
  }
  return 0;
}

size_t WireBufferBytes(WireFormat format, size_t n, int ranks) {
  return static_cast<size_t>(std::max(ranks, 1)) *
         WireChunkBytes(format, WireChunkValues(n, ranks));
}

void EncodeWireChunk(WireFormat format, const float* values, size_t count, size_t chunk_values,
                     uint8_t* out) {
  float block[kWireBlock];
  for (size_t b = 0; b < chunk_values / kWireBlock; ++b) {
    const size_t begin = b * kWireBlock;
    const size_t have = begin < count ? std::min(kWireBlock, count - begin) : 0;
    std::copy(values + begin, values + begin + have, block);
    std::fill(block + have, block + kWireBlock, 0.0f);
    EncodeBlock(format, block, out, chunk_values, b);
  }
}

void DecodeWireChunk(WireFormat format, const uint8_t* in, size_t chunk_values, size_t count,
                     float* out) {
  float block[kWireBlock];
  for (size_t b = 0; b * kWireBlock < count; ++b) {
    DecodeBlock(format, in, chunk_values, b, block);
    const size_t have = std::min(kWireBlock, count - b * kWireBlock);
    std::copy(block, block + have, out + b * kWireBlock);
  }
}

void SumWireChunks(WireFormat format, const uint8_t* in, int ranks, size_t chunk_values,
                   uint8_t* out) {
  const size_t chunk_bytes = WireChunkBytes(format, chunk_values);
  float sum[kWireBlock], x[kWireBlock];
  // Block by block: all of block b's inputs are read before it is written, so `out` may be
  // one of the inputs (a block is written only over the same block).
  for (size_t b = 0; b < chunk_values / kWireBlock; ++b) {
    std::fill(sum, sum + kWireBlock, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      DecodeBlock(format, in + static_cast<size_t>(r) * chunk_bytes, chunk_values, b, x);
      for (size_t i = 0; i < kWireBlock; ++i) sum[i] += x[i];
    }
    EncodeBlock(format, sum, out, chunk_values, b);
  }
}

namespace {

// Elements of chunk r of n values cut into chunks of c (0 past the end).
size_t ChunkCount(size_t n, size_t c, int r) {
  const size_t begin = static_cast<size_t>(r) * c;
  return begin < n ? std::min(c, n - begin) : size_t{0};
}

// The all-reduce's first half: every rank's chunks encoded and exchanged, and this rank's
// chunk summed, encoded, at the returned place in `recv`. Null with nothing to do.
absl::StatusOr<uint8_t*> ReduceOwnChunk(Communicator& comm, WireFormat format,
                                        const float* values, size_t n,
                                        std::vector<uint8_t>* send, std::vector<uint8_t>* recv) {
  if (format == WireFormat::kFp32) {
    return absl::InvalidArgumentError("the wire codec's collectives: fp32 is the backend's own");
  }
  const int ranks = comm.world_size();
  if (ranks == 1 || n == 0) return nullptr;
  const size_t c = WireChunkValues(n, ranks);
  const size_t cb = WireChunkBytes(format, c);
  send->resize(static_cast<size_t>(ranks) * cb);
  recv->resize(send->size());
  for (int r = 0; r < ranks; ++r) {
    EncodeWireChunk(format, values + static_cast<size_t>(r) * c, ChunkCount(n, c, r), c,
                    send->data() + static_cast<size_t>(r) * cb);
  }
  WEFT_RETURN_IF_ERROR(comm.AllToAll(send->data(), recv->data(), cb, DataType::kUInt8)->Wait());
  uint8_t* const mine = recv->data() + static_cast<size_t>(comm.rank()) * cb;
  SumWireChunks(format, recv->data(), ranks, c, mine);
  return mine;
}

}  // namespace

absl::Status WireAllReduce(Communicator& comm, WireFormat format, float* values, size_t n,
                           std::vector<uint8_t>* send, std::vector<uint8_t>* recv) {
  WEFT_ASSIGN_OR_RETURN(uint8_t* const mine, ReduceOwnChunk(comm, format, values, n, send, recv));
  if (mine == nullptr) return absl::OkStatus();
  const int ranks = comm.world_size();
  const size_t c = WireChunkValues(n, ranks);
  const size_t cb = WireChunkBytes(format, c);
  WEFT_RETURN_IF_ERROR(comm.AllGather(mine, recv->data(), cb, DataType::kUInt8)->Wait());
  for (int r = 0; r < ranks; ++r) {
    DecodeWireChunk(format, recv->data() + static_cast<size_t>(r) * cb, c, ChunkCount(n, c, r),
                    values + static_cast<size_t>(r) * c);
  }
  return absl::OkStatus();
}

absl::Status WireReduceScatter(Communicator& comm, WireFormat format, float* values, size_t n,
                               std::vector<uint8_t>* send, std::vector<uint8_t>* recv) {
  WEFT_ASSIGN_OR_RETURN(uint8_t* const mine, ReduceOwnChunk(comm, format, values, n, send, recv));
  if (mine == nullptr) return absl::OkStatus();
  const size_t c = WireChunkValues(n, comm.world_size());
  DecodeWireChunk(format, mine, c, ChunkCount(n, c, comm.rank()),
                  values + static_cast<size_t>(comm.rank()) * c);
  return absl::OkStatus();
}

}  // namespace weft::comm
