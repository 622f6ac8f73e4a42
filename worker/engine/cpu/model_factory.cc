// The CPU's architecture registry: a line per architecture in kCpuModels.
#include <cblas.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/engine/cpu/gpt2_model.h"
#include "worker/engine/cpu/llama_model.h"
#include "worker/engine/cpu/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine::cpu {
namespace {

// The entry of Model, the CPU model of architecture Arch (whose layers are Layers'), when
// `arch` is one.
template <typename Arch, typename Model, typename Layers>
std::optional<CpuModelEntry> EntryOf(const ModelArch& arch) {
  const auto* typed = dynamic_cast<const Arch*>(&arch);
  if (typed == nullptr) return std::nullopt;
  return CpuModelEntry{
      [typed](int max_b, int max_t, Checkpointing level) -> std::unique_ptr<CpuModel> {
        return std::make_unique<Model>(typed->config(), max_b, max_t, level);
      },
      [typed](int max_b, int max_t, Checkpointing level) {
        return Layers::PlannedActivationBytes(typed->config(), max_b, max_t, level);
      }};
}

using EntryFn = std::optional<CpuModelEntry> (*)(const ModelArch&);
constexpr EntryFn kCpuModels[] = {
    &EntryOf<Gpt2Arch, GptCpu, GptModel<float>>,
    &EntryOf<LlamaArch, LlamaCpu, LlamaModel<float>>,
};

}  // namespace

absl::StatusOr<CpuModelEntry> FindCpuModel(const ModelArch& arch) {
  for (EntryFn entry : kCpuModels) {
    if (std::optional<CpuModelEntry> found = entry(arch)) return *std::move(found);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model: architecture ", arch.name(), " has no CPU model"));
}

absl::StatusOr<std::unique_ptr<CpuModel>> CreateCpuModel(const ModelArch& arch, int max_b,
                                                         int max_t, Checkpointing level) {
  absl::StatusOr<CpuModelEntry> entry = FindCpuModel(arch);
  if (!entry.ok()) return entry.status();
  return entry->create(max_b, max_t, level);
}

absl::StatusOr<size_t> PlanCpuActivationBytes(const ModelArch& arch, int max_b, int max_t,
                                              Checkpointing level) {
  absl::StatusOr<CpuModelEntry> entry = FindCpuModel(arch);
  if (!entry.ok()) return entry.status();
  return entry->activation_bytes(max_b, max_t, level);
}

void SetBlasThreads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace weft::engine::cpu
