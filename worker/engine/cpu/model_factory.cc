// The CPU's architecture registry: one case per architecture.
#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "worker/engine/cpu/gpt2_model.h"
#include "worker/engine/cpu/llama_model.h"
#include "worker/engine/cpu/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine::cpu {

std::unique_ptr<CpuModel> CreateCpuModel(const ModelArch& arch, int max_b, int max_t,
                                         Checkpointing level) {
  if (const auto* gpt2 = dynamic_cast<const Gpt2Arch*>(&arch)) {
    return std::make_unique<GptCpu>(gpt2->config(), max_b, max_t, level);
  }
  if (const auto* llama = dynamic_cast<const LlamaArch*>(&arch)) {
    return std::make_unique<LlamaCpu>(llama->config(), max_b, max_t, level);
  }
  std::fprintf(stderr, "weft::engine::cpu: no CPU model for architecture %s\n",
               arch.name().c_str());
  std::abort();
}

size_t PlanCpuActivationBytes(const ModelArch& arch, int max_b, int max_t, Checkpointing level) {
  if (const auto* gpt2 = dynamic_cast<const Gpt2Arch*>(&arch)) {
    return GptModel<float>::PlannedActivationBytes(gpt2->config(), max_b, max_t, level);
  }
  if (const auto* llama = dynamic_cast<const LlamaArch*>(&arch)) {
    return LlamaModel<float>::PlannedActivationBytes(llama->config(), max_b, max_t, level);
  }
  std::fprintf(stderr, "weft::engine::cpu: no CPU model for architecture %s\n",
               arch.name().c_str());
  std::abort();
}

void SetBlasThreads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace weft::engine::cpu
