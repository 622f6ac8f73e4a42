// What the per-architecture CUDA models (gpt2_model.cc, llama_model.cc) share: one allocation
// for all activations carved by a measuring layout, the batch upload, and the logits chunking.
#ifndef WEFT_WORKER_ENGINE_CUDA_MODEL_UTIL_H_
#define WEFT_WORKER_ENGINE_CUDA_MODEL_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace weft::engine::cuda {

// Carves typed, 256-byte aligned pieces out of one allocation; with a null base it only
// measures, so a model's plan and its allocation share one layout function.
class Arena {
 public:
  explicit Arena(char* base) : base_(base) {}
  template <typename T>
  T* Take(size_t count) {
    offset_ = (offset_ + 255) / 256 * 256;
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += count * sizeof(T);
    return p;
  }
  size_t size() const { return offset_; }

 private:
  char* base_;
  size_t offset_ = 0;
};

// cudaMalloc of `bytes` into *arena; RESOURCE_EXHAUSTED naming the need and the free memory.
absl::Status AllocateActivations(size_t bytes, void** arena);

// Rows of one logits chunk (rows x Vp bf16): large enough for efficient LM-head GEMMs, small
// enough that the (B*T, Vp) logits of a whole micro-batch never exist at once; in [1, n].
int LogitChunkRows(size_t n, int padded_vocab);

// SetBatch's shared part: checks (b, t) against [1, max_b] x [1, max_t] (INVALID_ARGUMENT) and
// copies the host (B, T) tokens (and targets, when not null) to the device buffers on `stream`.
absl::Status UploadBatch(int b, int t, int max_b, int max_t, const int32_t* inputs,
                         const int32_t* targets, int32_t* tokens_dev, int32_t* targets_dev,
                         cudaStream_t stream);

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_MODEL_UTIL_H_
