// Helpers shared by the bf16 kernels: 128-bit vector loads and stores of 8 bf16 values,
// deterministic block reductions, argument checks, and the second phase of the two-phase
// parameter-gradient reductions (defined in bias.cu).
#ifndef WEFT_WORKER_ENGINE_CUDA_BF16_CUH_
#define WEFT_WORKER_ENGINE_CUDA_BF16_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

// Returns the absl::Status `expr` from the enclosing function if it is not OK (common/status.h
// has the same macro but pulls in gRPC, which nvcc is kept away from).
#define WEFT_BF16_RETURN_IF_ERROR(expr)                    \
  do {                                                     \
    const ::absl::Status weft_bf16_status_ = (expr);       \
    if (!weft_bf16_status_.ok()) return weft_bf16_status_; \
  } while (0)

namespace weft::engine::cuda::internal {

// bf16 values per 128-bit vector: the width of every vectorized bf16 load and store.
inline constexpr int kVec = 8;

// 8 bf16 packed in a 128-bit vector, as floats.
__device__ inline void Unpack(const uint4& raw, float (&out)[kVec]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec / 2; ++k) {
    const float2 f = __bfloat1622float2(pairs[k]);
    out[2 * k] = f.x;
    out[2 * k + 1] = f.y;
  }
}

// Loads 8 consecutive bf16 (16-byte aligned) as floats.
__device__ inline void LoadVec(const bf16* p, float (&out)[kVec]) {
  Unpack(*reinterpret_cast<const uint4*>(p), out);
}

// Rounds 8 floats to bf16 (nearest even) and stores them (16-byte aligned).
__device__ inline void StoreVec(bf16* p, const float (&in)[kVec]) {
  uint4 raw;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec / 2; ++k) pairs[k] = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// Loads / stores 8 consecutive floats (16-byte aligned) as two 128-bit accesses.
__device__ inline void LoadFloats(const float* p, float (&out)[kVec]) {
  const float4 lo = reinterpret_cast<const float4*>(p)[0];
  const float4 hi = reinterpret_cast<const float4*>(p)[1];
  out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
  out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
}

__device__ inline void StoreFloats(float* p, const float (&in)[kVec]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(in[0], in[1], in[2], in[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(in[4], in[5], in[6], in[7]);
}

__device__ inline float WarpMax(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// Warp butterflies, then the warp totals in warp order: deterministic. `shared` holds 32
// floats; the call ends with a barrier, so it can be reused right after.
__device__ inline float BlockSum(float x, float* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = WarpSum(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += shared[w];
  __syncthreads();
  return total;
}

// Online softmax state: the running max m and sum s = sum_j exp(x_j - m). m = -inf (s = 0)
// for an empty set, which Merge handles without producing exp(-inf - -inf) = NaN.
struct MaxSum {
  float m;
  float s;
};

// Symmetric: Merge(a, b) and Merge(b, a) are bit-identical (explicit roundings, so nvcc
// cannot contract one product into an FMA), hence every lane of a butterfly gets the same.
__device__ inline MaxSum Merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, __fmul_rn(a.s, expf(a.m - m)) + __fmul_rn(b.s, expf(b.m - m))};
}

// Folds 8 values into the state: x holds scaled scores, the masked ones -inf, at least one of
// them finite (so the new max is finite and exp(-inf - m) = 0 drops the masked ones).
__device__ inline MaxSum AddVec(MaxSum acc, const float (&x)[kVec]) {
  float vec_max = -INFINITY;
#pragma unroll
  for (int k = 0; k < kVec; ++k) vec_max = fmaxf(vec_max, x[k]);
  const float m = fmaxf(acc.m, vec_max);
  float s = acc.s * expf(acc.m - m);
#pragma unroll
  for (int k = 0; k < kVec; ++k) s += expf(x[k] - m);
  return {m, s};
}

__device__ inline MaxSum WarpMerge(MaxSum x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const MaxSum other = {__shfl_xor_sync(0xffffffffu, x.m, offset),
                          __shfl_xor_sync(0xffffffffu, x.s, offset)};
    x = Merge(x, other);
  }
  return x;
}

// Host-side checks, each naming the op and the argument.
inline absl::Status CheckNotNull(const void* p, const char* op, const char* arg) {
  if (p != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is null"));
}

inline absl::Status CheckAligned16(const void* p, const char* op, const char* arg) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is null"));
  if (reinterpret_cast<uintptr_t>(p) % 16 == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", arg, " is not 16-byte aligned (128-bit vector access)"));
}

// One pointer argument of a launcher and what it must be: 16-byte aligned (a bf16 tensor read
// as vectors; implies non-null) or just non-null.
struct PointerArg {
  const void* ptr;
  const char* name;
  bool aligned16;
};
inline PointerArg Aligned16(const void* p, const char* name) { return {p, name, true}; }
inline PointerArg NotNull(const void* p, const char* name) { return {p, name, false}; }

// The checks above over a launcher's pointers, in order: the first failure is returned.
inline absl::Status CheckPointers(const char* op, std::initializer_list<PointerArg> args) {
  for (const PointerArg& arg : args) {
    WEFT_BF16_RETURN_IF_ERROR(arg.aligned16 ? CheckAligned16(arg.ptr, op, arg.name)
                                            : CheckNotNull(arg.ptr, op, arg.name));
  }
  return absl::OkStatus();
}

inline absl::Status CheckPositive(int64_t x, const char* op, const char* arg) {
  if (x > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " = ", x, " must be positive"));
}

inline absl::Status CheckMultipleOf8(int64_t x, const char* op, const char* arg) {
  if (x > 0 && x % kVec == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", arg, " = ", x, " must be a positive multiple of 8"));
}

// First phase of a two-phase column reduction over the rows of an (N, C) tensor (BiasBackward,
// the norms' weight gradients): a grid of (256-channel tiles) x (row slabs), each block
// kWarpSize threads across its tile (8 channels each, 16-byte loads) by kColumnRowLanes row
// lanes, combined in order into one partial row per slab. About kColumnTargetBlocks blocks in
// all, at least kColumnRowLanes rows a slab; a function of (N, C) alone, never of the device,
// so the order of the sums is reproducible.
inline constexpr int kColumnRowLanes = 8;
inline constexpr int kColumnTileChannels = kWarpSize * kVec;
inline constexpr int kColumnTargetBlocks = 1024;

inline int ColumnSlabRows(int n, int c) {
  const int tiles = (c + kColumnTileChannels - 1) / kColumnTileChannels;
  const int slabs = tiles >= kColumnTargetBlocks ? 1 : kColumnTargetBlocks / tiles;
  const int rows = (n + slabs - 1) / slabs;
  return rows > kColumnRowLanes ? rows : kColumnRowLanes;
}

inline int ColumnSlabs(int n, int c) {
  const int rows = ColumnSlabRows(n, c);
  return (n + rows - 1) / rows;
}

// Second phase of a two-phase column reduction: for col in [0, m),
//   out[col] += sum_{p in [0, parts)} partials[p, col]     (fp32, fixed order)
// where columns [0, split) go to out0 and [split, m) to out1[col - split] (LayerNorm reduces
// dweight and dbias in one pass). partials (parts, m). Defined in bias.cu.
absl::Status LaunchAddColumnSums(float* out0, float* out1, int split, const float* partials,
                                 int parts, int m, cudaStream_t stream);

}  // namespace weft::engine::cuda::internal

#endif  // WEFT_WORKER_ENGINE_CUDA_BF16_CUH_
