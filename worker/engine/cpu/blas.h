// Row-major GEMM, overloaded for float (cblas_sgemm) and double (cblas_dgemm), so that every
// op can be instantiated in double for tight gradient checks while production runs in float.
//
//   C (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C
//
// op(X) is X or X^T as trans_a / trans_b say; lda/ldb/ldc are row strides in elements, which
// lets callers address strided sub-matrices (e.g. one attention head inside a (T, 3C) row)
// without copies.
//
// Determinism: at a FIXED thread count OpenBLAS results are bit-identical run to run (each
// element of C is reduced by one thread, no atomics). Across thread counts they are NOT:
// OpenBLAS 0.3.21's threaded driver partitions C by the thread count and the partitions' edges
// go through kernels that round differently (measured in gpt_test.cc: 1, 2, 3 and 8 threads
// all differ in the last bits). So the worker pins the BLAS thread count (SetBlasThreads) for
// a job, and bit-identical replay means the same thread count on the same CPU type: OpenBLAS
// (DYNAMIC_ARCH) also picks its kernels for the CPU it runs on.
#ifndef WEFT_WORKER_ENGINE_CPU_BLAS_H_
#define WEFT_WORKER_ENGINE_CPU_BLAS_H_

#include <cblas.h>

namespace weft::engine::cpu {

inline void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void Gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace weft::engine::cpu

#endif  // WEFT_WORKER_ENGINE_CPU_BLAS_H_
