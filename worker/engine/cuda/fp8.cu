// FP8 casting (fp8.h): the amax reduction and the scaled, saturating cast with its transpose.
//
// Both are memory-bound passes. Fp8Amax reads x once in 16-byte vectors (a grid-stride loop,
// a warp and then block maximum, one atomicMax a block on the float's bits: non-negative
// floats order as their bit patterns do, and a quiet NaN's are above infinity's, so a NaN
// anywhere makes the maximum NaN). Fp8Cast takes 64 x 64 tiles, a block each: it
// reads the tile once, writes the straight cast in 8-byte rows and stages the bytes
// transposed in shared memory for 16-byte rows of the transpose. Its tallies (Fp8CastCounts)
// are summed over each warp and added with one atomic a warp where they are not zero.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/fp8.h"
#include "worker/engine/cuda/launch.cuh"

namespace weft::engine::cuda {
namespace {

using internal::kVec;
using internal::kWarpSize;
using internal::LoadVec;

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;

__device__ inline float WarpMax(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// s = max_finite / amax: 1 for amax 0, NaN for an amax that is not finite.
__device__ inline float ScaleOf(float amax, float max_finite) {
  if (!isfinite(amax)) return __int_as_float(0x7fc00000);
  return amax > 0.0f ? max_finite / amax : 1.0f;
}

constexpr int kTile = 64;
// Bytes a staged row. A warp's byte stores for one column j of its 4 rows x 8 vectors hit the
// rows c + j of 8 vectors 8 columns apart: with 68 bytes a row they fall in 4 banks (2 ways),
// with 64 or 80 in one (8 ways). Rows are then 4-byte aligned, so the transposed rows are read
// as 4 words.
constexpr int kTileStride = kTile + 4;

// The block's maximum of m (its NaN flag folded in as a quiet NaN's bits), offered to
// *amax_bits; every thread of the block calls it (it holds barriers).
__device__ inline void OfferBlockMax(unsigned int* amax_bits, float m, bool nan) {
  m = WarpMax(m);
  nan = __any_sync(0xffffffffu, nan);
  __shared__ float warp_max[internal::kBlockSize / kWarpSize];
  __shared__ int any_nan;
  if (threadIdx.x == 0) any_nan = 0;
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) {
    warp_max[threadIdx.x / kWarpSize] = m;
    if (nan) any_nan = 1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float block = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) {
      block = fmaxf(block, warp_max[w]);
    }
    // A quiet NaN's bits (0x7fc00000) exceed every finite float's and infinity's.
    atomicMax(amax_bits, any_nan ? 0x7fc00000u : __float_as_uint(block));
  }
}

// fmaxf returns the other operand where one is NaN, so a NaN is carried as a flag beside the
// maximum and the block then offers a quiet NaN's bits.
__global__ void AmaxKernel(unsigned int* __restrict__ amax_bits,  // one float's bits, |x| max
                           const bf16* __restrict__ x,            // (n)
                           int64_t vecs) {                        // n / 8
  float m = 0.0f;
  bool nan = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[kVec];
    LoadVec(x + i * kVec, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      nan |= isnan(v[k]);
      m = fmaxf(m, fabsf(v[k]));
    }
  }
  OfferBlockMax(amax_bits, m, nan);
}

template <__nv_fp8_interpretation_t kFormat>
__global__ void __launch_bounds__(internal::kBlockSize)
    CastKernel(uint8_t* __restrict__ out,            // (rows, cols) or null
               uint8_t* __restrict__ out_t,          // (cols, rows) or null
               float* __restrict__ scale_inv,        // one float or null
               unsigned int* __restrict__ amax_out,  // x's amax bits, or null
               Fp8CastCounts* __restrict__ counts,   // += tallies, or null
               const bf16* __restrict__ x,           // (rows, cols)
               const float* __restrict__ amax, int rows, int cols, float max_finite,
               float saturation) {
  __shared__ __align__(16) uint8_t staged[kTile * kTileStride];  // [col][row] of the tile
  const float s = ScaleOf(*amax, max_finite);
  if (scale_inv != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    *scale_inv = 1.0f / s;
  }
  const int r0 = blockIdx.y * kTile;
  const int c0 = blockIdx.x * kTile;
  constexpr int kRowVecs = kTile / kVec;  // 8 vectors a tile row
  float m = 0.0f;
  bool nan = false;
  unsigned int underflows = 0, saturated = 0;
#pragma unroll
  for (int k = 0; k < kTile * kRowVecs / internal::kBlockSize; ++k) {
    const int v = threadIdx.x + k * internal::kBlockSize;
    const int r = v / kRowVecs;
    const int c = (v % kRowVecs) * kVec;
    // cols and rows are multiples of 16: a vector is whole wherever it starts inside.
    if (r0 + r >= rows || c0 + c >= cols) continue;
    const size_t at = static_cast<size_t>(r0 + r) * cols + c0 + c;
    float f[kVec];
    LoadVec(x + at, f);
    uint8_t b[kVec];
#pragma unroll
    for (int j = 0; j < kVec; j += 2) {
      if (amax_out != nullptr) {
        nan |= isnan(f[j]) || isnan(f[j + 1]);
        m = fmaxf(m, fmaxf(fabsf(f[j]), fabsf(f[j + 1])));
      }
      const __nv_fp8x2_storage_t pair =
          __nv_cvt_float2_to_fp8x2(make_float2(f[j] * s, f[j + 1] * s), __NV_SATFINITE, kFormat);
      b[j] = static_cast<uint8_t>(pair & 0xff);
      b[j + 1] = static_cast<uint8_t>(pair >> 8);
      if (counts != nullptr) {
        // 0x00 and 0x80 are the two zeros of both formats.
        underflows +=
            (f[j] != 0.0f && (b[j] & 0x7f) == 0) + (f[j + 1] != 0.0f && (b[j + 1] & 0x7f) == 0);
        saturated += (fabsf(f[j] * s) >= saturation) + (fabsf(f[j + 1] * s) >= saturation);
      }
    }
    if (out != nullptr) {
      uint2 packed;
      packed.x = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
      packed.y = b[4] | (b[5] << 8) | (b[6] << 16) | (static_cast<uint32_t>(b[7]) << 24);
      *reinterpret_cast<uint2*>(out + at) = packed;
    }
    if (out_t != nullptr) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) staged[(c + j) * kTileStride + r] = b[j];
    }
  }
  if (amax_out != nullptr) OfferBlockMax(amax_out, m, nan);
  if (counts != nullptr) {
    underflows = __reduce_add_sync(0xffffffffu, underflows);
    saturated = __reduce_add_sync(0xffffffffu, saturated);
    if (threadIdx.x % kWarpSize == 0) {
      if (underflows != 0)
        atomicAdd(&counts->underflows, static_cast<unsigned long long>(underflows));
      if (saturated != 0) atomicAdd(&counts->saturated, static_cast<unsigned long long>(saturated));
    }
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
      atomicAdd(&counts->values, static_cast<unsigned long long>(rows) * cols);
    }
  }
  if (out_t == nullptr) return;
  __syncthreads();
  // A transposed row (a tile column) is 64 bytes: 4 threads write 16 each.
  const int c = threadIdx.x / 4;
  const int r = (threadIdx.x % 4) * 16;
  if (c0 + c >= cols || r0 + r >= rows) return;
  const uint32_t* from = reinterpret_cast<const uint32_t*>(staged + c * kTileStride + r);
  *reinterpret_cast<uint4*>(out_t + static_cast<size_t>(c0 + c) * rows + r0 + r) =
      make_uint4(from[0], from[1], from[2], from[3]);
}

absl::Status CheckMultipleOf16(int64_t x, const char* op, const char* arg) {
  if (x > 0 && x % 16 == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", arg, " = ", x, " must be a positive multiple of 16"));
}

}  // namespace

float Fp8MaxFinite(Fp8Format format) { return format == Fp8Format::kE4M3 ? kE4M3Max : kE5M2Max; }

float Fp8SaturationThreshold(Fp8Format format) {
  // E4M3: 448 = 1.75 x 2^8, steps of 32 there; E5M2: 57344 = 1.75 x 2^15, steps of 8192.
  return format == Fp8Format::kE4M3 ? kE4M3Max + 16.0f : kE5M2Max + 4096.0f;
}

const char* Fp8FormatName(Fp8Format format) { return format == Fp8Format::kE4M3 ? "E4M3" : "E5M2"; }

absl::Status Fp8Amax(float* amax, const bf16* x, int64_t n, cudaStream_t stream) {
  constexpr const char* kOp = "Fp8Amax";
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckMultipleOf8(n, kOp, "n"));
  WEFT_BF16_RETURN_IF_ERROR(
      internal::CheckPointers(kOp, {internal::NotNull(amax, "amax"), internal::Aligned16(x, "x")}));
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  const int64_t vecs = n / kVec;
  return internal::Launch(AmaxKernel, internal::GridFor(vecs), internal::kBlockSize, 0, stream,
                          reinterpret_cast<unsigned int*>(amax), x, vecs);
}

absl::Status Fp8Cast(uint8_t* out, uint8_t* out_t, float* scale_inv, const bf16* x,
                     const float* amax, int rows, int cols, Fp8Format format, cudaStream_t stream,
                     float* amax_out, Fp8CastCounts* counts) {
  constexpr const char* kOp = "Fp8Cast";
  WEFT_BF16_RETURN_IF_ERROR(CheckMultipleOf16(rows, kOp, "rows"));
  WEFT_BF16_RETURN_IF_ERROR(CheckMultipleOf16(cols, kOp, "cols"));
  if (out == nullptr && out_t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": out and out_t are both null"));
  }
  WEFT_BF16_RETURN_IF_ERROR(
      internal::CheckPointers(kOp, {internal::Aligned16(x, "x"), internal::NotNull(amax, "amax")}));
  if (out != nullptr) WEFT_BF16_RETURN_IF_ERROR(internal::CheckAligned16(out, kOp, "out"));
  if (out_t != nullptr) WEFT_BF16_RETURN_IF_ERROR(internal::CheckAligned16(out_t, kOp, "out_t"));
  if ((rows + kTile - 1) / kTile > 65535) {  // the grid's y limit
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": rows = ", rows, " beyond ", 65535 * kTile));
  }
  if (amax_out != nullptr && (amax_out == amax || amax_out == scale_inv)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": amax_out must be apart from amax and scale_inv"));
  }
  if (amax_out != nullptr) {
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(amax_out, 0, sizeof(float), stream));
  }
  unsigned int* amax_bits = reinterpret_cast<unsigned int*>(amax_out);
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile);
  const float max_finite = Fp8MaxFinite(format);
  const float saturation = Fp8SaturationThreshold(format);
  return format == Fp8Format::kE4M3
             ? internal::Launch(CastKernel<__NV_E4M3>, grid, internal::kBlockSize, 0, stream, out,
                                out_t, scale_inv, amax_bits, counts, x, amax, rows, cols,
                                max_finite, saturation)
             : internal::Launch(CastKernel<__NV_E5M2>, grid, internal::kBlockSize, 0, stream, out,
                                out_t, scale_inv, amax_bits, counts, x, amax, rows, cols,
                                max_finite, saturation);
}

}  // namespace weft::engine::cuda
