// The GPU's architecture registry: one case per architecture with a CUDA model.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/gpt2_model.h"
#include "worker/engine/cuda/llama_model.h"
#include "worker/engine/cuda/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine::cuda {

absl::StatusOr<std::unique_ptr<CudaModel>> CreateCudaModel(
    const ModelArch& arch, int max_b, int max_t, CheckpointingPlan level, cudaStream_t stream,
    const ArenaRequests& requests) {
  if (const auto* gpt2 = dynamic_cast<const Gpt2Arch*>(&arch)) {
    return GptCuda::Create(gpt2->config(), max_b, max_t, level, stream, requests);
  }
  if (const auto* llama = dynamic_cast<const LlamaArch*>(&arch)) {
    return LlamaCuda::Create(llama->config(), max_b, max_t, level, stream, requests);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model: architecture ", arch.name(), " has no CUDA model"));
}

size_t PlanCudaActivationBytes(const ModelArch& arch, int max_b, int max_t,
                               CheckpointingPlan level, const ArenaRequests& requests) {
  if (const auto* gpt2 = dynamic_cast<const Gpt2Arch*>(&arch)) {
    return GptCuda::PlanActivationBytes(gpt2->config(), max_b, max_t, level, requests);
  }
  if (const auto* llama = dynamic_cast<const LlamaArch*>(&arch)) {
    return LlamaCuda::PlanActivationBytes(llama->config(), max_b, max_t, level, requests);
  }
  return 0;
}

}  // namespace weft::engine::cuda
