// The sizes the GPU memory plan (worker/zero/gpu_memory_plan.h) needs of the CUDA model and
// kernels, without CUDA: the plan runs (and is tested) on machines that have none, and the
// kernels and model allocate by these same definitions.
#ifndef WEFT_WORKER_ENGINE_CUDA_PLAN_SIZES_H_
#define WEFT_WORKER_ENGINE_CUDA_PLAN_SIZES_H_

#include <cstddef>
#include <vector>

namespace weft::engine::cuda {

// What the model's one allocation holds for the engine, besides its activations and scratch.
struct ArenaRequests {
  // One entry per block, or empty: room for each block's gradient over spent activations
  // (CudaModel::SpentActivationGradient).
  std::vector<size_t> spent_grad_bytes;
  // bf16 elements of CudaModel::HeadWork, 0 for none.
  size_t head_work_elements = 0;
  // The blocks' Linear layers in FP8 (fp8_linear.h: E4M3 inputs and weights, E5M2 output
  // gradients, per-tensor current scaling), with the allocation holding their casts' scratch;
  // false: bf16. The job's precision FP8 (gpu_memory_plan.h sets it).
  bool fp8_linears = false;
};

// SumOfSquares (ops.h) runs phase 1 in at most this many blocks of this many elements each
// (256 threads of 8 elements: adamw.cu checks it against its launch shape), one partial sum
// per block: the count depends only on n, so the partials and their order are reproducible.
inline constexpr size_t kSumOfSquaresMaxBlocks = 1024;
inline constexpr size_t kSumOfSquaresBlockElements = size_t{256} * 8;

// The fp32 scratch SumOfSquares needs for n elements: one float per phase-1 block.
constexpr size_t SumOfSquaresScratchFloats(size_t n) {
  const size_t blocks = (n + kSumOfSquaresBlockElements - 1) / kSumOfSquaresBlockElements;
  return blocks < kSumOfSquaresMaxBlocks ? blocks : kSumOfSquaresMaxBlocks;
}

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_PLAN_SIZES_H_
