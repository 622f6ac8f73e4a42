// The GEMMs of the GPU engine: cuBLASLt for the Linear layers (bf16 in, fp32 accumulation, the
// bias fused into the epilogue) and cuBLAS strided-batched GEMMs for attention.
//
// Everything is row-major like the rest of the engine: a Linear layer's weight is (OC, C) and
// out = inp @ weight^T + bias. cuBLAS is column-major, so each call below is the transposed
// product (a row-major (R, K) matrix is a column-major (K, R) one); the comments give the
// row-major meaning only.
//
// Plans (descriptors and the chosen algorithm) are cached per shape, so steady-state calls make
// no heuristic queries. Not thread-safe: one Blas per compute stream's driving thread.
#ifndef WEFT_WORKER_ENGINE_CUDA_MATMUL_H_
#define WEFT_WORKER_ENGINE_CUDA_MATMUL_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/cuda/fp8.h"

namespace weft::engine::cuda {

using bf16 = __nv_bfloat16;

// One FP8 operand of an FP8 GEMM: row-major with the contraction dimension K contiguous
// (K-major, what Hopper's FP8 kernels take), in `format`, and the device float that
// dequantizes it (an element stands for its value times *scale_inv; fp8.h's Fp8Cast writes it),
// 16-byte aligned.
struct Fp8Operand {
  const uint8_t* data = nullptr;
  Fp8Format format = Fp8Format::kE4M3;
  const float* scale_inv = nullptr;
};

struct BlasOptions {
  // cuBLASLt workspace; 32 MiB is what cuBLAS recommends for Hopper.
  size_t workspace_bytes = size_t{32} << 20;
};

class Blas {
 public:
  // Creates the handles and the workspace on the current device.
  static absl::StatusOr<std::unique_ptr<Blas>> Create(const BlasOptions& options = {});
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // out (N, OC) = inp (N, C) @ weight (OC, C)^T (+ bias (OC) when not null).
  absl::Status LinearForward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                             int n, int c, int oc, cudaStream_t stream);
  // A projection back into the residual stream, the residual added in the GEMM's epilogue:
  //   out (N, OC) = inp (N, C) @ weight (OC, C)^T (+ bias (OC)) + residual (N, OC)
  // in fp32, rounded to bf16 once (the product is not rounded on its own first). residual may
  // be out itself.
  absl::Status LinearForwardResidual(bf16* out, const bf16* inp, const bf16* weight,
                                     const bf16* bias, const bf16* residual, int n, int c, int oc,
                                     cudaStream_t stream);
  // The MLP's first layer with GELU fused into the GEMM's epilogue (tanh approximation, as the
  // GeluForward kernel, to bf16 precision):
  //   pre (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC);  out (N, OC) = gelu(pre)
  absl::Status LinearForwardGelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight,
                                 const bf16* bias, int n, int c, int oc, cudaStream_t stream);
  // dinp (N, C) = (dout (N, OC) @ weight (OC, C)) * gelu'(pre (N, C)): the input gradient of
  // a Linear layer whose input was gelu(pre), the GELU backward fused into the epilogue.
  absl::Status LinearBackwardInputGelu(bf16* dinp, const bf16* dout, const bf16* weight,
                                       const bf16* pre, int n, int c, int oc,
                                       cudaStream_t stream);
  // dinp (N, C) = dout (N, OC) @ weight (OC, C)   (written, not accumulated)
  absl::Status LinearBackwardInput(bf16* dinp, const bf16* dout, const bf16* weight, int n, int c,
                                   int oc, cudaStream_t stream);
  // dweight (OC, C) += dout (N, OC)^T @ inp (N, C)   (fp32 gradient; = when !accumulate)
  absl::Status LinearBackwardWeight(float* dweight, const bf16* dout, const bf16* inp, int n,
                                    int c, int oc, bool accumulate, cudaStream_t stream);

  // FP8 GEMMs (compute capability 8.9 and later; elsewhere FAILED_PRECONDITION): fp32
  // accumulation of the FP8 products, multiplied by both operands' scale_inv.
  //   out (N, M) = a (N, K) @ b (M, K)^T  (+ bias (M) when not null) (+ residual (N, M) when
  //   not null: a projection back into the residual stream, as LinearForwardResidual; it may
  //   be out itself), rounded to bf16 once, written.
  // The forward is a = the input, b = the weight; the input gradient a = the output gradient,
  // b = the weight transposed; the weight gradient (Fp8LinearF32) a = the output gradient
  // transposed, b = the input transposed. Not both E5M2 (cuBLASLt has no such kernel).
  // N, K and M multiples of 16. fast_accum: Hopper's faster FP8 accumulation, which rounds
  // partial sums more often (what Transformer Engine uses for the forward, not the gradients).
  absl::Status Fp8Linear(bf16* out, const Fp8Operand& a, const Fp8Operand& b, const bf16* bias,
                         const bf16* residual, int n, int k, int m, bool fast_accum,
                         cudaStream_t stream);
  //   out (N, M) (+)= a (N, K) @ b (M, K)^T in fp32 (= when !accumulate): weight gradients.
  absl::Status Fp8LinearF32(float* out, const Fp8Operand& a, const Fp8Operand& b, int n, int k,
                            int m, bool accumulate, cudaStream_t stream);

  // Attention GEMMs over `batch` = B * NH independent heads; q, k, v, dy, dq, dk, dv are
  // (batch, T, HS), att and datt (batch, T, T), all bf16 with fp32 accumulation. `alpha`
  // scales the product; every output is written (=).
  //   scores (batch, T, T) = q @ k^T
  absl::Status AttentionScores(bf16* scores, const bf16* q, const bf16* k, int batch, int t,
                               int hs, cudaStream_t stream);
  //   y (batch, T, HS) = att @ v          (also dq = datt @ k)
  absl::Status AttentionApply(bf16* y, const bf16* att, const bf16* v, int batch, int t, int hs,
                              cudaStream_t stream);
  //   dv (batch, T, HS) = att^T @ dy      (also dk = datt^T @ q)
  absl::Status AttentionApplyTransposed(bf16* dv, const bf16* att, const bf16* dy, int batch,
                                        int t, int hs, cudaStream_t stream);

 private:
  // A cached cuBLASLt plan for one problem shape.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  enum Epilogue : int { kPlain, kBias, kGeluAuxBias, kDGelu };
  // (trans_a, trans_b, m, n, k, d_is_fp32, epilogue, accumulate)
  using PlanKey = std::tuple<bool, bool, int, int, int, bool, int, bool>;
  // FP8, always "TN" (A transposed, B not): (A's format, B's format, m, n, k, d_is_fp32,
  // bias, accumulate, fast_accum)
  using Fp8PlanKey = std::tuple<int, int, int, int, int, bool, bool, bool, bool>;

  explicit Blas(const BlasOptions& options);
  absl::StatusOr<Plan*> GetPlan(const PlanKey& key);
  absl::StatusOr<Plan*> GetFp8Plan(const Fp8PlanKey& key);
  // The algorithm for a plan's descriptors (the heuristic's first), or UNIMPLEMENTED with
  // `what` where cuBLASLt has none.
  absl::Status ChooseAlgorithm(Plan* plan, const std::string& what);
  // D = a b^T (+ bias) (+ C when accumulate; c null: D itself).
  absl::Status Fp8Matmul(const char* op, void* d, bool d_fp32, const Fp8Operand& a,
                         const Fp8Operand& b, const bf16* bias, int n, int k, int m,
                         bool accumulate, bool fast_accum, cudaStream_t stream,
                         const void* c = nullptr);
  // Column-major D (m, n) = op(A) op(B) [+ bias (m)] [+ C when accumulate].
  // `aux`: the GELU epilogues' pre-activation (written by kGeluAuxBias, read by kDGelu),
  // column-major (m, n) like D. `c`: C, laid out as D; null: D itself.
  absl::Status LtMatmul(const PlanKey& key, void* d, const bf16* a, const bf16* b,
                        const bf16* bias, cudaStream_t stream, const bf16* aux = nullptr,
                        const void* c = nullptr);
  absl::Status Batched(bool trans_a, bool trans_b, int m, int n, int k, const bf16* a,
                       int64_t stride_a, const bf16* b, int64_t stride_b, bf16* c,
                       int64_t stride_c, int batch, cudaStream_t stream);

  BlasOptions options_;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
  std::map<Fp8PlanKey, std::unique_ptr<Plan>> fp8_plans_;
  int fp8_capable_ = -1;  // -1: not asked yet; 0: below compute capability 8.9; 1: FP8 GEMMs
};

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_MATMUL_H_
