#include "worker/engine/cuda/fp8_linear.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/cuda/model_util.h"

namespace weft::engine::cuda {
namespace {

// The stats slots: each tensor's amax at 8 * slot, its scale_inv 4 floats (16 bytes) on.
enum Slot : int { kInput = 0, kWeight = 1, kGradient = 2 };

// Lays the pieces out on `arena` (measuring only when its base is null).
Fp8LinearScratch Lay(Arena& arena, int max_rows, int max_width, size_t max_weight) {
  Fp8LinearScratch s;
  s.max_rows = max_rows;
  s.max_width = max_width;
  s.max_weight = max_weight;
  const size_t activation = static_cast<size_t>(max_rows) * max_width;
  s.inp = arena.Take<uint8_t>(activation);
  s.weight = arena.Take<uint8_t>(max_weight);
  s.dout = arena.Take<uint8_t>(activation);
  s.dout_t = arena.Take<uint8_t>(activation);
  s.stats = arena.Take<float>(Fp8LinearScratch::kStatsFloats);
  return s;
}

}  // namespace

size_t Fp8LinearScratch::Bytes(int max_rows, int max_width, size_t max_weight) {
  Arena measure(nullptr);
  Lay(measure, max_rows, max_width, max_weight);
  return measure.size();
}

Fp8LinearScratch Fp8LinearScratch::At(char* base, int max_rows, int max_width, size_t max_weight) {
  Arena arena(base);
  return Lay(arena, max_rows, max_width, max_weight);
}

absl::Status Fp8Linears::CheckShape(const char* op, int n, int c, int oc) const {
  if (n > scratch_.max_rows || std::max(c, oc) > scratch_.max_width ||
      static_cast<size_t>(c) * oc > scratch_.max_weight) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": n = ", n, ", c = ", c, ", oc = ", oc,
                                                   " beyond the FP8 scratch's ", scratch_.max_rows,
                                                   " rows, ", scratch_.max_width, " features and ",
                                                   scratch_.max_weight, " weight elements"));
  }
  return absl::OkStatus();
}

absl::Status Fp8Linears::Cast(uint8_t* out, uint8_t* out_t, const bf16* x, int rows, int cols,
                              Fp8Format format, int slot, cudaStream_t stream) {
  float* amax = scratch_.stats + 8 * slot;
  WEFT_RETURN_IF_ERROR(Fp8Amax(amax, x, static_cast<int64_t>(rows) * cols, stream));
  return Fp8Cast(out, out_t, amax + 4, x, amax, rows, cols, format, stream);
}

Fp8Operand Fp8Linears::Operand(const uint8_t* data, Fp8Format format, int slot) const {
  return {data, format, scratch_.stats + 8 * slot + 4};
}

absl::Status Fp8Linears::Forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                                 const bf16* residual, int n, int c, int oc, cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(CheckShape("Fp8Linears::Forward", n, c, oc));
  WEFT_RETURN_IF_ERROR(Cast(scratch_.inp, nullptr, inp, n, c, Fp8Format::kE4M3, kInput, stream));
  WEFT_RETURN_IF_ERROR(
      Cast(scratch_.weight, nullptr, weight, oc, c, Fp8Format::kE4M3, kWeight, stream));
  return blas_->Fp8Linear(out, Operand(scratch_.inp, Fp8Format::kE4M3, kInput),
                          Operand(scratch_.weight, Fp8Format::kE4M3, kWeight), bias, residual, n, c,
                          oc, /*fast_accum=*/true, stream);
}

absl::Status Fp8Linears::Backward(bf16* dinp, float* dweight, bool accumulate, const bf16* dout,
                                  const bf16* inp, const bf16* weight, int n, int c, int oc,
                                  cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(CheckShape("Fp8Linears::Backward", n, c, oc));
  WEFT_RETURN_IF_ERROR(
      Cast(scratch_.dout, scratch_.dout_t, dout, n, oc, Fp8Format::kE5M2, kGradient, stream));
  WEFT_RETURN_IF_ERROR(Cast(nullptr, scratch_.inp, inp, n, c, Fp8Format::kE4M3, kInput, stream));
  WEFT_RETURN_IF_ERROR(
      Cast(nullptr, scratch_.weight, weight, oc, c, Fp8Format::kE4M3, kWeight, stream));
  // dweight (OC, C) = dout^T (OC, N) @ inp^T (C, N)^T.
  WEFT_RETURN_IF_ERROR(blas_->Fp8LinearF32(
      dweight, Operand(scratch_.dout_t, Fp8Format::kE5M2, kGradient),
      Operand(scratch_.inp, Fp8Format::kE4M3, kInput), oc, n, c, accumulate, stream));
  // dinp (N, C) = dout (N, OC) @ weight^T (C, OC)^T.
  return blas_->Fp8Linear(dinp, Operand(scratch_.dout, Fp8Format::kE5M2, kGradient),
                          Operand(scratch_.weight, Fp8Format::kE4M3, kWeight), nullptr, nullptr, n,
                          oc, c, /*fast_accum=*/false, stream);
}

}  // namespace weft::engine::cuda
