// Model FLOPs utilisation (MFU): the share of a device's peak arithmetic that the model's own
// forward and backward passes use. One definition for the worker's reports, the metrics and the
// benchmarks, so that their figures compare.
#ifndef WEFT_WORKER_MFU_H_
#define WEFT_WORKER_MFU_H_

#include "weft/v1/job.pb.h"

namespace weft::worker {

// FLOPs one training token costs, forward and backward: 6 per parameter (the weight matmuls)
// plus 12 x layers x width x context (the attention scores and their use). Recomputation and
// padding are not counted: they are overhead, not model work.
double TrainingFlopsPerToken(const weft::v1::ModelSpec& model);

// MFU of one device that trains `tokens_per_s` tokens per second at `flops_per_token`, against
// its `peak_flops`; 0 when the peak is unknown (not positive).
double Mfu(double tokens_per_s, double flops_per_token, double peak_flops);

}  // namespace weft::worker

#endif  // WEFT_WORKER_MFU_H_
