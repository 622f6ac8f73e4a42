#include "worker/mfu.h"

#include "common/job_spec.h"

namespace weft::worker {

double TrainingFlopsPerToken(const weft::v1::ModelSpec& model) {
  return 6.0 * static_cast<double>(ModelParameterCount(model)) +
         12.0 * model.num_layers() * model.hidden_size() *
             static_cast<double>(model.context_length());
}

double Mfu(double tokens_per_s, double flops_per_token, double peak_flops) {
  return peak_flops > 0 ? tokens_per_s * flops_per_token / peak_flops : 0;
}

}  // namespace weft::worker
