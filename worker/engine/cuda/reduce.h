// Small reductions the GPU ZeRO engine needs between the layers: gradient accumulation across
// micro-steps and the step's loss sum, both without a host round trip.
#ifndef WEFT_WORKER_ENGINE_CUDA_REDUCE_H_
#define WEFT_WORKER_ENGINE_CUDA_REDUCE_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace weft::engine::cuda {

// dst[i] += src[i] for i < n.
absl::Status AccumulateInto(float* dst, const float* src, size_t n, cudaStream_t stream);
// *out += sum of x[0, n) (one block, fixed order: deterministic). For per-position losses, so
// n is at most a few hundred thousand.
absl::Status SumInto(float* out, const float* x, size_t n, cudaStream_t stream);

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_REDUCE_H_
