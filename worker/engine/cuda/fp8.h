// FP8 tensors for the FP8 GEMMs (Blas::Fp8Linear): per-tensor current scaling.
//
// A bf16 tensor x becomes x8 = saturate(round(x * s)) in E4M3 (forward operands: 3 mantissa
// bits, largest finite 448) or E5M2 (gradients: 2 mantissa bits, largest finite 57344), with
//   s = max_finite / amax(x)      (amax 0: s = 1; amax not finite: s = NaN, so a non-finite
//                                  input stays non-finite downstream and the step is skipped)
// and the GEMM multiplies its fp32 product back by scale_inv = 1 / s of each operand. The
// largest |x| lands on the format's largest finite value; nothing saturates unless amax was
// computed from other data than x.
//
// Delayed scaling takes s from an amax of earlier steps (a history's maximum) instead of x's
// own, so the cast needs no pass of its own over x first: Fp8Cast then also reduces x's amax
// (amax_out) for the history, in the same pass. Values beyond the stale amax saturate.
//
// On Hopper the FP8 GEMMs take both operands K-major (row-major with the contraction dimension
// contiguous), so a Linear layer's backward needs its operands transposed too: Fp8Cast writes
// the cast tensor, its transpose, or both in one pass (one read of x).
//
// Contracts:
//  - Fp8Amax WRITES (=) one device float; Fp8Cast writes (=) its outputs, *scale_inv and
//    *amax_out, and ACCUMULATES (+=) into *counts.
//  - Both run on `stream` only (the amax is zeroed there first); nothing is synchronized.
//  - rows and cols multiples of 16 (the FP8 GEMMs' alignment; every Linear shape Weft builds
//    meets it), pointers 16-byte aligned.
#ifndef WEFT_WORKER_ENGINE_CUDA_FP8_H_
#define WEFT_WORKER_ENGINE_CUDA_FP8_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace weft::engine::cuda {

using bf16 = __nv_bfloat16;

enum class Fp8Format : int {
  kE4M3 = 0,  // 4 exponent bits, 3 mantissa bits; no infinities; largest finite 448
  kE5M2 = 1,  // 5 exponent bits, 2 mantissa bits; IEEE-like; largest finite 57344
};

// What casts did to their values, tallied on the device (Fp8Cast's counts): a value underflows
// when it is not zero but its cast is (its magnitude times s fell below half the format's
// smallest subnormal), and saturates when its magnitude times s lies beyond what rounds to the
// largest finite value (Fp8SaturationThreshold: only a stale amax, delayed scaling's, allows
// it; the amax itself may land a rounding above the largest finite value and is not counted). A
// non-finite value is neither.
struct Fp8CastCounts {
  unsigned long long values = 0;
  unsigned long long underflows = 0;
  unsigned long long saturated = 0;
};

// 448 or 57344.
float Fp8MaxFinite(Fp8Format format);
// The largest finite value plus half the format's last step, where rounding would leave the
// finite range: 464 (E4M3) or 61440 (E5M2).
float Fp8SaturationThreshold(Fp8Format format);
const char* Fp8FormatName(Fp8Format format);

// amax (device, one float) = max |x| over x's n elements (n a positive multiple of 8); NaN if
// any element is NaN.
absl::Status Fp8Amax(float* amax, const bf16* x, int64_t n, cudaStream_t stream);

// From x (rows, cols) bf16 and an amax (device float: x's own as Fp8Amax wrote it, or a
// history's for delayed scaling), s = max_finite / *amax:
//   out   (rows, cols) = cast(x * s)          when not null
//   out_t (cols, rows) = cast(x * s)^T        when not null (not both null)
//   *scale_inv (device float) = 1 / s         when not null
//   *amax_out (device float) = x's amax       when not null (apart from amax and scale_inv)
//   *counts (device) += x's values, underflows and saturations    when not null
absl::Status Fp8Cast(uint8_t* out, uint8_t* out_t, float* scale_inv, const bf16* x,
                     const float* amax, int rows, int cols, Fp8Format format, cudaStream_t stream,
                     float* amax_out = nullptr, Fp8CastCounts* counts = nullptr);

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_FP8_H_
