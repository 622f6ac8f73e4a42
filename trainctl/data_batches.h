// The batches a job's workers read, rebuilt outside the job (`trainctl data batches`): the
// rows of every rank for one optimizer step or for the validation pass, with the targets that
// do not count ignored and the documents of each row, so that another implementation
// (transformers, tests/fixtures/hf/masked_loss.py) can compute the loss Weft reports on exactly
// the same tokens.
#ifndef WEFT_TRAINCTL_DATA_BATCHES_H_
#define WEFT_TRAINCTL_DATA_BATCHES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "weft/v1/job.pb.h"
#include "worker/data/token_dataset.h"

namespace weft::dataprep {

// Row-major (rows, seq_len) matrices.
struct JobBatches {
  int rows = 0;
  int seq_len = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;     // -1 where the target is ignored
  std::vector<int32_t> doc_starts;  // where each token's document begins in its row
  bool document_masking = false;    // the engine attends within documents (doc_starts apply)
  bool reset_positions = false;     // positions restart at each document (with masking)
};

// What the `world` ranks of a job with the normalized `spec` read for `split`:
//  - kTrain: optimizer step `step` (0-based, as the engine numbers it: the step reported as
//    step + 1): micro-steps 0 .. grad_accum_steps - 1.
//  - kVal: one validation pass (every pass reads the same rows): micro-batches
//    0 .. val_batches - 1 at step 0; `step` is ignored.
// Both with the job's seed, the rows in the order micro-step, then rank, then the rank's rows
// (each rank's rows are TokenDataset::Batch's, called as the worker calls it). The loss Weft
// reports for them is the mean over all rows' counted targets (the engine's masked mean).
// Errors: the dataset's (TokenDataset::Open), validation off (val_interval_steps 0) for kVal,
// world < 1, step < 0.
absl::StatusOr<JobBatches> ReadJobBatches(const weft::v1::JobSpec& spec, data::Split split,
                                          int64_t step, int world);

// The batch as masked_loss.py reads it: {"inputs", "targets", and with document masking
// "doc_starts" and "reset_positions"}.
nlohmann::json MaskedLossBatchJson(const JobBatches& batches);

}  // namespace weft::dataprep

#endif  // WEFT_TRAINCTL_DATA_BATCHES_H_
