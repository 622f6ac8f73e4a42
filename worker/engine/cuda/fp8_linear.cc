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
Fp8LinearScratch Lay(Arena& arena, int max_rows, int max_width, size_t max_weight,
                     size_t kept_bytes) {
  Fp8LinearScratch s;
  s.max_rows = max_rows;
  s.max_width = max_width;
  s.max_weight = max_weight;
  s.kept_bytes = kept_bytes;
  const size_t activation = static_cast<size_t>(max_rows) * max_width;
  s.inp = arena.Take<uint8_t>(activation);
  s.weight = arena.Take<uint8_t>(max_weight);
  s.dout = arena.Take<uint8_t>(activation);
  s.dout_t = arena.Take<uint8_t>(activation);
  s.stats = arena.Take<float>(Fp8LinearScratch::kStatsFloats);
  s.counts = arena.Take<Fp8CastCounts>(2);
  if (kept_bytes > 0) {
    s.kept = arena.Take<uint8_t>(kept_bytes);
    s.kept_stats = arena.Take<float>(8 * Fp8LinearScratch::kMaxKept);
  }
  return s;
}

}  // namespace

size_t Fp8LinearScratch::Bytes(int max_rows, int max_width, size_t max_weight, size_t kept_bytes) {
  Arena measure(nullptr);
  Lay(measure, max_rows, max_width, max_weight, kept_bytes);
  return measure.size();
}

Fp8LinearScratch Fp8LinearScratch::At(char* base, int max_rows, int max_width, size_t max_weight,
                                      size_t kept_bytes) {
  Arena arena(base);
  return Lay(arena, max_rows, max_width, max_weight, kept_bytes);
}

void Fp8Linears::StartKeeping() {
  kept_.clear();
  kept_used_ = 0;
  keeping_ = true;
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
                              Fp8Format format, float* stats, cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(Fp8Amax(stats, x, static_cast<int64_t>(rows) * cols, stream));
  return Fp8Cast(out, out_t, stats + 4, x, stats, rows, cols, format, stream, nullptr,
                 scratch_.counts + static_cast<int>(format));
}

float* Fp8Linears::Stats(int slot) const { return scratch_.stats + 8 * slot; }

Fp8Operand Fp8Linears::Operand(const uint8_t* data, Fp8Format format, int slot) const {
  return {data, format, Stats(slot) + 4};
}

absl::StatusOr<Fp8Operand> Fp8Linears::ForwardOperand(uint8_t* out, const bf16* x, int rows,
                                                      int cols, int slot, cudaStream_t stream) {
  const size_t room = Fp8LinearScratch::KeptBytes(static_cast<size_t>(rows) * cols);
  if (!keeping_ || kept_.size() >= Fp8LinearScratch::kMaxKept ||
      kept_used_ + room > scratch_.kept_bytes) {
    WEFT_RETURN_IF_ERROR(Cast(out, nullptr, x, rows, cols, Fp8Format::kE4M3, Stats(slot), stream));
    return Operand(out, Fp8Format::kE4M3, slot);
  }
  Kept k{x, rows, cols, scratch_.kept + kept_used_, scratch_.kept_stats + 8 * kept_.size()};
  WEFT_RETURN_IF_ERROR(Cast(out, k.transposed, x, rows, cols, Fp8Format::kE4M3, k.stats, stream));
  kept_.push_back(k);
  kept_used_ += room;
  return Fp8Operand{out, Fp8Format::kE4M3, k.stats + 4};
}

absl::StatusOr<Fp8Operand> Fp8Linears::TransposedOperand(uint8_t* out, const bf16* x, int rows,
                                                         int cols, int slot, cudaStream_t stream) {
  // The latest keep of x wins, should one tensor have been cast twice.
  for (auto k = kept_.rbegin(); k != kept_.rend(); ++k) {
    if (k->source == x && k->rows == rows && k->cols == cols) {
      ++kept_reads_;
      return Fp8Operand{k->transposed, Fp8Format::kE4M3, k->stats + 4};
    }
  }
  WEFT_RETURN_IF_ERROR(Cast(nullptr, out, x, rows, cols, Fp8Format::kE4M3, Stats(slot), stream));
  return Operand(out, Fp8Format::kE4M3, slot);
}

absl::Status Fp8Linears::Forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                                 const bf16* residual, int n, int c, int oc, cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(CheckShape("Fp8Linears::Forward", n, c, oc));
  WEFT_ASSIGN_OR_RETURN(const Fp8Operand a,
                        ForwardOperand(scratch_.inp, inp, n, c, kInput, stream));
  WEFT_ASSIGN_OR_RETURN(const Fp8Operand b,
                        ForwardOperand(scratch_.weight, weight, oc, c, kWeight, stream));
  return blas_->Fp8Linear(out, a, b, bias, residual, n, c, oc, /*fast_accum=*/true, stream);
}

absl::Status Fp8Linears::Backward(bf16* dinp, float* dweight, bool accumulate, const bf16* dout,
                                  const bf16* inp, const bf16* weight, int n, int c, int oc,
                                  cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(CheckShape("Fp8Linears::Backward", n, c, oc));
  WEFT_RETURN_IF_ERROR(Cast(scratch_.dout, scratch_.dout_t, dout, n, oc, Fp8Format::kE5M2,
                            Stats(kGradient), stream));
  WEFT_ASSIGN_OR_RETURN(const Fp8Operand inp_t,
                        TransposedOperand(scratch_.inp, inp, n, c, kInput, stream));
  WEFT_ASSIGN_OR_RETURN(const Fp8Operand weight_t,
                        TransposedOperand(scratch_.weight, weight, oc, c, kWeight, stream));
  // dweight (OC, C) = dout^T (OC, N) @ inp^T (C, N)^T.
  WEFT_RETURN_IF_ERROR(blas_->Fp8LinearF32(dweight,
                                           Operand(scratch_.dout_t, Fp8Format::kE5M2, kGradient),
                                           inp_t, oc, n, c, accumulate, stream));
  // dinp (N, C) = dout (N, OC) @ weight^T (C, OC)^T.
  return blas_->Fp8Linear(dinp, Operand(scratch_.dout, Fp8Format::kE5M2, kGradient), weight_t,
                          nullptr, nullptr, n, oc, c, /*fast_accum=*/false, stream);
}

}  // namespace weft::engine::cuda
