// CUDA error handling for the CUDA engine.
//
// Policy (two kinds of failure, two mechanisms):
//  - Launcher and runtime-API errors (a bad launch configuration, a sticky error left by an
//    earlier kernel, out of memory) are RETURNED as absl::Status through
//    WEFT_CUDA_RETURN_IF_ERROR: the worker can then report the failure to the coordinator and
//    exit through its normal path instead of dying mid-collective.
//  - CUDA_CHECK aborts the process with file:line and the CUDA error string. It is for
//    programmer errors and for places that cannot return a Status (destructors, test
//    fixtures' cleanup); never for conditions a caller could handle.
#ifndef WEFT_WORKER_ENGINE_CUDA_CUDA_CHECK_H_
#define WEFT_WORKER_ENGINE_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace weft::engine::cuda {

[[noreturn]] inline void CudaCheckFailed(cudaError_t err, const char* expr, const char* file,
                                         int line) {
  std::fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s\n", file, line, cudaGetErrorName(err),
               cudaGetErrorString(err), expr);
  std::abort();
}

// An absl::Status naming the failed call and the CUDA error; OK for cudaSuccess.
inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

}  // namespace weft::engine::cuda

#define CUDA_CHECK(expr)                                                               \
  do {                                                                                 \
    const cudaError_t weft_cuda_check_err_ = (expr);                                   \
    if (weft_cuda_check_err_ != cudaSuccess) {                                         \
      ::weft::engine::cuda::CudaCheckFailed(weft_cuda_check_err_, #expr, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

#define WEFT_CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                   \
    const cudaError_t weft_cuda_status_err_ = (expr);                                    \
    if (weft_cuda_status_err_ != cudaSuccess) {                                          \
      return ::weft::engine::cuda::CudaStatus(weft_cuda_status_err_, #expr);             \
    }                                                                                    \
  } while (0)

#endif  // WEFT_WORKER_ENGINE_CUDA_CUDA_CHECK_H_
