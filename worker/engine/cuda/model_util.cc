#include "worker/engine/cuda/model_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/cuda_check.h"

namespace weft::engine::cuda {
namespace {

constexpr size_t kLogitChunkBytes = size_t{512} << 20;

}  // namespace

absl::Status AllocateActivations(size_t bytes, void** arena) {
  const cudaError_t err = cudaMalloc(arena, bytes);
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear the (non-sticky) allocation error
  *arena = nullptr;
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  return absl::ResourceExhaustedError(absl::StrCat("activations need ", bytes >> 20,
                                                   " MiB but the GPU has ", free_bytes >> 20,
                                                   " MiB free"));
}

int LogitChunkRows(size_t n, int padded_vocab) {
  const size_t row_bytes = static_cast<size_t>(padded_vocab) * 2;  // bf16
  return static_cast<int>(std::clamp<size_t>(kLogitChunkBytes / row_bytes, 1, n));
}

absl::Status UploadBatch(int b, int t, int max_b, int max_t, const int32_t* inputs,
                         const int32_t* targets, int32_t* tokens_dev, int32_t* targets_dev,
                         cudaStream_t stream) {
  if (b < 1 || b > max_b || t < 1 || t > max_t) {
    return absl::InvalidArgumentError(absl::StrCat("batch shape (", b, ", ", t, ") outside [1, ",
                                                   max_b, "] x [1, ", max_t, "]"));
  }
  const size_t bytes = static_cast<size_t>(b) * t * sizeof(int32_t);
  // Pageable sources: the call returns once the data is staged, so the caller may refill them.
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(tokens_dev, inputs, bytes, cudaMemcpyHostToDevice, stream));
  if (targets != nullptr) {
    WEFT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(targets_dev, targets, bytes, cudaMemcpyHostToDevice, stream));
  }
  return absl::OkStatus();
}

}  // namespace weft::engine::cuda
