// A block's Linear layers in FP8, what a model calls in place of Blas's bf16 Linear GEMMs when
// it trains in FP8 (issue 42; the models do not yet): per-tensor current scaling (fp8.h), the
// inputs and weights in E4M3, the output gradients in E5M2, fp32 accumulation, parameter
// gradients in fp32 as ever.
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
// dead once its GEMMs are enqueued, so calls on one stream may reuse it. The input is cast
// again in the backward rather than kept from the forward: under activation checkpointing the
// forward's input is recomputed anyway, and FP8 copies kept per layer would cost N (C + I) bytes
// a block.
#ifndef WEFT_WORKER_ENGINE_CUDA_FP8_LINEAR_H_
#define WEFT_WORKER_ENGINE_CUDA_FP8_LINEAR_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
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

  // Bytes of device memory the pieces take, each 256-byte aligned (an Arena's Take).
  static size_t Bytes(int max_rows, int max_width, size_t max_weight);
  // The pieces laid out from `base` (256-byte aligned, Bytes() long).
  static Fp8LinearScratch At(char* base, int max_rows, int max_width, size_t max_weight);
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

 private:
  absl::Status CheckShape(const char* op, int n, int c, int oc) const;
  // amax of x (rows, cols) into stats slot `slot`, then its cast into out and/or out_t.
  absl::Status Cast(uint8_t* out, uint8_t* out_t, const bf16* x, int rows, int cols,
                    Fp8Format format, int slot, cudaStream_t stream);
  Fp8Operand Operand(const uint8_t* data, Fp8Format format, int slot) const;

  Blas* blas_;
  Fp8LinearScratch scratch_;
};

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_FP8_LINEAR_H_
