// The GPU's architecture registry: a line per architecture with a CUDA model in kCudaModels.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/gpt2_model.h"
#include "worker/engine/cuda/llama_model.h"
#include "worker/engine/cuda/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine::cuda {
namespace {

// The entry of Model, the CUDA model of architecture Arch, when `arch` is one.
template <typename Arch, typename Model>
std::optional<CudaModelEntry> EntryOf(const ModelArch& arch) {
  const auto* typed = dynamic_cast<const Arch*>(&arch);
  if (typed == nullptr) return std::nullopt;
  return CudaModelEntry{
      [typed](int max_b, int max_t, CheckpointingPlan level, cudaStream_t stream,
              const ArenaRequests& requests) -> absl::StatusOr<std::unique_ptr<CudaModel>> {
        absl::StatusOr<std::unique_ptr<Model>> model =
            Model::Create(typed->config(), max_b, max_t, level, stream, requests);
        if (!model.ok()) return model.status();
        return std::unique_ptr<CudaModel>(*std::move(model));
      },
      [typed](int max_b, int max_t, CheckpointingPlan level, const ArenaRequests& requests) {
        return Model::PlanActivationBytes(typed->config(), max_b, max_t, level, requests);
      }};
}

using EntryFn = std::optional<CudaModelEntry> (*)(const ModelArch&);
constexpr EntryFn kCudaModels[] = {
    &EntryOf<Gpt2Arch, GptCuda>,
    &EntryOf<LlamaArch, LlamaCuda>,
};

}  // namespace

absl::StatusOr<CudaModelEntry> FindCudaModel(const ModelArch& arch) {
  for (EntryFn entry : kCudaModels) {
    if (std::optional<CudaModelEntry> found = entry(arch)) return *std::move(found);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model: architecture ", arch.name(), " has no CUDA model"));
}

absl::StatusOr<std::unique_ptr<CudaModel>> CreateCudaModel(
    const ModelArch& arch, int max_b, int max_t, CheckpointingPlan level, cudaStream_t stream,
    const ArenaRequests& requests) {
  absl::StatusOr<CudaModelEntry> entry = FindCudaModel(arch);
  if (!entry.ok()) return entry.status();
  return entry->create(max_b, max_t, level, stream, requests);
}

absl::StatusOr<size_t> PlanCudaActivationBytes(const ModelArch& arch, int max_b, int max_t,
                                               CheckpointingPlan level,
                                               const ArenaRequests& requests) {
  absl::StatusOr<CudaModelEntry> entry = FindCudaModel(arch);
  if (!entry.ok()) return entry.status();
  return entry->activation_bytes(max_b, max_t, level, requests);
}

}  // namespace weft::engine::cuda
