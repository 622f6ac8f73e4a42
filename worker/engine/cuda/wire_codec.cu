#include "worker/engine/cuda/wire_codec.h"

#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"

#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"

namespace weft::engine::cuda {
namespace {

using comm::kWireBlock;
using comm::WireFormat;
using internal::kWarpSize;

static_assert(kWireBlock == internal::kBlockSize, "one thread per value of a block");
constexpr int kWarps = kWireBlock / kWarpSize;

// Block b of the whole vector (its chunks' blocks in order): chunk b / blocks_per_chunk, block
// b % blocks_per_chunk of it; thread t is value t of the block.
struct BlockAt {
  size_t chunk, local;
  __device__ BlockAt(size_t b, size_t blocks_per_chunk)
      : chunk(b / blocks_per_chunk), local(b % blocks_per_chunk) {}
};

__device__ float* ScaleOf(uint8_t* chunk, size_t local) {
  return reinterpret_cast<float*>(chunk) + local;
}
__device__ int8_t* Int8Of(uint8_t* chunk, size_t chunk_values, size_t local) {
  return reinterpret_cast<int8_t*>(chunk + chunk_values / kWireBlock * sizeof(float)) +
         local * kWireBlock;
}

// Value threadIdx.x of block `local` of a chunk, decoded.
__device__ float DecodeValue(WireFormat format, const uint8_t* chunk, size_t chunk_values,
                             size_t local) {
  if (format == WireFormat::kBf16) {
    return __bfloat162float(
        reinterpret_cast<const __nv_bfloat16*>(chunk)[local * kWireBlock + threadIdx.x]);
  }
  uint8_t* c = const_cast<uint8_t*>(chunk);
  // Rounded multiply (no fused multiply-add with the caller's sum): the CPU's arithmetic.
  return __fmul_rn(static_cast<float>(Int8Of(c, chunk_values, local)[threadIdx.x]),
                   *ScaleOf(c, local));
}

// The block's largest |x| (a NaN if any value is one; an infinity if any is one and none is
// NaN), on every thread. Calls __syncthreads: every thread of the block must call it.
__device__ float BlockAbsMax(float x) {
  __shared__ float warp_max[kWarps];
  float m = isnan(x) ? x : fabsf(x);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, m, offset);
    m = (isnan(m) || isnan(other)) ? __int_as_float(0x7fc00000) : fmaxf(m, other);
  }
  if (threadIdx.x % kWarpSize == 0) warp_max[threadIdx.x / kWarpSize] = m;
  __syncthreads();
  float all = warp_max[0];
  for (int w = 1; w < kWarps; ++w) {
    all = (isnan(all) || isnan(warp_max[w])) ? __int_as_float(0x7fc00000)
                                               : fmaxf(all, warp_max[w]);
  }
  return all;
}

// Value threadIdx.x (x) of block `local`, encoded into `chunk`. Every thread must call it.
__device__ void EncodeValue(WireFormat format, float x, uint8_t* chunk, size_t chunk_values,
                            size_t local) {
  if (format == WireFormat::kBf16) {
    reinterpret_cast<__nv_bfloat16*>(chunk)[local * kWireBlock + threadIdx.x] =
        __float2bfloat16_rn(x);
    return;
  }
  const float amax = BlockAbsMax(x);
  const bool finite = isfinite(amax);
  const float s = finite ? __fdiv_rn(amax, 127.0f) : amax;
  int8_t q = 0;
  if (finite && s != 0.0f) {
    q = static_cast<int8_t>(fminf(fmaxf(rintf(__fdiv_rn(x, s)), -127.0f), 127.0f));
  }
  Int8Of(chunk, chunk_values, local)[threadIdx.x] = q;
  if (threadIdx.x == 0) *ScaleOf(chunk, local) = s;
}

__global__ void EncodeKernel(WireFormat format, const float* values, size_t n,
                             size_t chunk_values, size_t chunk_bytes, uint8_t* out) {
  const BlockAt at(blockIdx.x, chunk_values / kWireBlock);
  // The vector's chunks are consecutive: value i of the padded vector is values[i].
  const size_t i = blockIdx.x * size_t{kWireBlock} + threadIdx.x;
  EncodeValue(format, i < n ? values[i] : 0.0f, out + at.chunk * chunk_bytes, chunk_values,
              at.local);
}

__global__ void SumKernel(WireFormat format, const uint8_t* in, int ranks, size_t chunk_values,
                          size_t chunk_bytes, uint8_t* out) {
  const size_t local = blockIdx.x;
  float sum = 0.0f;
  for (int r = 0; r < ranks; ++r) {
    sum = __fadd_rn(sum, DecodeValue(format, in + static_cast<size_t>(r) * chunk_bytes,
                                     chunk_values, local));
  }
  // Every thread has read its inputs (including any under `out`) before the block's first
  // write: the int8 encoding synchronises the block first, the bf16 one writes only the value
  // this thread read.
  __syncthreads();
  EncodeValue(format, sum, out, chunk_values, local);
}

__global__ void DecodeKernel(WireFormat format, const uint8_t* in, size_t chunk_values,
                             size_t chunk_bytes, float* values, size_t n) {
  const BlockAt at(blockIdx.x, chunk_values / kWireBlock);
  const size_t i = blockIdx.x * size_t{kWireBlock} + threadIdx.x;
  const float x = DecodeValue(format, in + at.chunk * chunk_bytes, chunk_values, at.local);
  if (i < n) values[i] = x;
}

absl::Status CheckFormat(WireFormat format, const char* what) {
  if (format == WireFormat::kBf16 || format == WireFormat::kInt8) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": the wire format must be bf16 or int8 (fp32 is NCCL's all-reduce)"));
}

}  // namespace

absl::Status EncodeWireChunks(WireFormat format, const float* values, size_t n, int ranks,
                              size_t chunk_values, size_t chunk_bytes, uint8_t* out,
                              cudaStream_t stream) {
  if (absl::Status s = CheckFormat(format, "EncodeWireChunks"); !s.ok()) return s;
  const size_t blocks = static_cast<size_t>(ranks) * chunk_values / kWireBlock;
  return internal::Launch(EncodeKernel, dim3(static_cast<unsigned>(blocks)), dim3(kWireBlock), 0,
                          stream, format, values, n, chunk_values, chunk_bytes, out);
}

absl::Status SumWireChunks(WireFormat format, const uint8_t* in, int ranks, size_t chunk_values,
                           size_t chunk_bytes, uint8_t* out, cudaStream_t stream) {
  if (absl::Status s = CheckFormat(format, "SumWireChunks"); !s.ok()) return s;
  return internal::Launch(SumKernel, dim3(static_cast<unsigned>(chunk_values / kWireBlock)),
                          dim3(kWireBlock), 0, stream, format, in, ranks, chunk_values,
                          chunk_bytes, out);
}

absl::Status DecodeWireChunks(WireFormat format, const uint8_t* in, int ranks,
                              size_t chunk_values, size_t chunk_bytes, float* values, size_t n,
                              cudaStream_t stream) {
  if (absl::Status s = CheckFormat(format, "DecodeWireChunks"); !s.ok()) return s;
  const size_t blocks = static_cast<size_t>(ranks) * chunk_values / kWireBlock;
  return internal::Launch(DecodeKernel, dim3(static_cast<unsigned>(blocks)), dim3(kWireBlock), 0,
                          stream, format, in, chunk_values, chunk_bytes, values, n);
}

}  // namespace weft::engine::cuda
