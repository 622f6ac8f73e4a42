// A block's Linear layers in FP8, what a model calls in place of Blas's bf16 Linear GEMMs when
// it trains in FP8 (ArenaModel::Linear): per-tensor current scaling (fp8.h), the inputs and
// weights in E4M3, the output gradients in E5M2, fp32 accumulation, parameter gradients in fp32
// as ever.
//
//   Forward   out (N, OC) = inp (N, C) @ weight (OC, C)^T (+ bias) (+ residual): the input
//             and the weight cast (amax, then cast), one FP8 GEMM with fast accumulation.
//   Backward  dweight (OC, C) (+)= dout^T @ inp and dinp (N, C) = dout @ weight: the output
//             gradient cast straight and transposed, the input and the weight cast
//             transposed (Hopper's FP8 GEMMs take both operands K-major), then the two GEMMs
//             without fast accumulation. Everything it reads is cast before anything is
//             written, so dinp may be inp or dout (the models place gradients over spent
//             activations).
//
// The casts live in one scratch (Fp8LinearScratch) the layers share: each call's casts are
// dead once its GEMMs are enqueued, so calls on one stream may reuse it.
//
// Kept casts. Activation checkpointing runs a block's forward again right before its backward,
// over the same inputs and weights. A Forward made while keeping (StartKeeping) casts its input
// and weight transposed as well, in the same pass, into the scratch's kept room, and the
// Backward of the same tensors takes those casts and their scales instead of reducing and
// casting again: per Linear it saves two amax passes and two casts over bf16, for one more
// FP8 write. The forward proper keeps nothing: an input kept from it would cost N (C + I)
// bytes a block until the backward, and its weights are gathered again by then.
#ifndef WEFT_WORKER_ENGINE_CUDA_FP8_LINEAR_H_
#define WEFT_WORKER_ENGINE_CUDA_FP8_LINEAR_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/cuda/fp8.h"
#include "worker/engine/cuda/matmul.h"

namespace weft::engine::cuda {

// Where the casts go, for layers of up to max_rows rows, max_width input or output features
// and max_weight weight elements.
struct Fp8LinearScratch {
  int max_rows = 0;
  int max_width = 0;
  size_t max_weight = 0;
  uint8_t* inp = nullptr;     // (max_rows * max_width): the input, straight or transposed
  uint8_t* weight = nullptr;  // (max_weight): the weight, straight or transposed
  uint8_t* dout = nullptr;    // (max_rows * max_width): the output gradient
  uint8_t* dout_t = nullptr;  // (max_rows * max_width): its transpose
  float* stats = nullptr;     // kStatsFloats: each tensor's amax and scale_inv, 16-byte apart
  static constexpr int kStatsFloats = 3 * 8;
  // What every cast did (fp8.h), accumulating: [0] E4M3 (inputs and weights), [1] E5M2
  // (output gradients). Whoever lays the scratch out zeroes them.
  Fp8CastCounts* counts = nullptr;
  // Kept casts (Fp8Linears::StartKeeping): up to kMaxKept transposed tensors in kept_bytes,
  // each taking its elements rounded up to 256 bytes, with their amax and scale_inv.
  static constexpr int kMaxKept = 8;
  size_t kept_bytes = 0;
  uint8_t* kept = nullptr;      // (kept_bytes)
  float* kept_stats = nullptr;  // kMaxKept * 8
  // Room for a kept tensor of `elements` elements.
  static size_t KeptBytes(size_t elements) { return (elements + 255) / 256 * 256; }

  // Bytes of device memory the pieces take, each 256-byte aligned (an Arena's Take); kept_bytes
  // 0: nothing is ever kept.
  static size_t Bytes(int max_rows, int max_width, size_t max_weight, size_t kept_bytes = 0);
  // The pieces laid out from `base` (256-byte aligned, Bytes() long).
  static Fp8LinearScratch At(char* base, int max_rows, int max_width, size_t max_weight,
                             size_t kept_bytes = 0);
};

class Fp8Linears {
 public:
  // Both outlive this.
  Fp8Linears(Blas* blas, const Fp8LinearScratch& scratch) : blas_(blas), scratch_(scratch) {}

  // out (N, OC) = inp (N, C) @ weight (OC, C)^T (+ bias (OC) when not null) (+ residual (N, OC)
  // when not null; it may be out), written. N, C and OC multiples of 16 within the scratch's
  // bounds, else INVALID_ARGUMENT.
  absl::Status Forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                       const bf16* residual, int n, int c, int oc, cudaStream_t stream);
  // dweight (OC, C) += (= when !accumulate) dout (N, OC)^T @ inp (N, C), fp32; then
  // dinp (N, C) = dout @ weight (OC, C), written; dinp may be inp or dout.
  absl::Status Backward(bf16* dinp, float* dweight, bool accumulate, const bf16* dout,
                        const bf16* inp, const bf16* weight, int n, int c, int oc,
                        cudaStream_t stream);

  // Forgets every kept cast; Forward calls from now on keep the transposed casts of their
  // inputs and weights while the kept room and slots last (beyond them they keep nothing, which
  // costs only the saving). A Backward reads a kept cast in place of `inp` or `weight` when one
  // was kept from the same pointer at the same shape. The caller promises those tensors hold
  // the same values from that Forward to that Backward: the models keep from a block's
  // recomputation (ArenaModel::RecomputeBlock) to its backward, which reads them next.
  void StartKeeping();
  // Forward calls stop keeping; what was kept stays readable until the next StartKeeping.
  void StopKeeping() { keeping_ = false; }
  // Backward operands read from kept casts since this object was made (tests).
  int64_t kept_reads() const { return kept_reads_; }

 private:
  // A transposed cast kept from a Forward.
  struct Kept {
    const bf16* source = nullptr;
    int rows = 0, cols = 0;
    uint8_t* transposed = nullptr;  // (cols, rows)
    float* stats = nullptr;         // amax, then scale_inv 4 floats on
  };

  absl::Status CheckShape(const char* op, int n, int c, int oc) const;
  // amax of x (rows, cols) into stats[0], then its cast into out and/or out_t, its scale_inv
  // into stats[4], tallied in scratch_.counts.
  absl::Status Cast(uint8_t* out, uint8_t* out_t, const bf16* x, int rows, int cols,
                    Fp8Format format, float* stats, cudaStream_t stream);
  // The scratch's stats of slot `slot` (kStatsFloats / 8 of them): amax, then scale_inv.
  float* Stats(int slot) const;
  Fp8Operand Operand(const uint8_t* data, Fp8Format format, int slot) const;
  // A forward operand: x (rows, cols) cast to E4M3 into out, its transpose kept too when
  // keeping and there is room.
  absl::StatusOr<Fp8Operand> ForwardOperand(uint8_t* out, const bf16* x, int rows, int cols,
                                            int slot, cudaStream_t stream);
  // A backward operand: x (rows, cols) transposed in E4M3, kept or cast into out.
  absl::StatusOr<Fp8Operand> TransposedOperand(uint8_t* out, const bf16* x, int rows, int cols,
                                               int slot, cudaStream_t stream);

  Blas* blas_;
  Fp8LinearScratch scratch_;
  bool keeping_ = false;
  std::vector<Kept> kept_;  // at most kMaxKept
  size_t kept_used_ = 0;    // bytes of scratch_.kept taken
  int64_t kept_reads_ = 0;
};

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_FP8_LINEAR_H_
