#include "trainctl/data_batches.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace weft::dataprep {

absl::StatusOr<JobBatches> ReadJobBatches(const weft::v1::JobSpec& spec, data::Split split,
                                          int64_t step, int world) {
  const weft::v1::TrainingSpec& training = spec.training();
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("world ", world, ": want >= 1"));
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, ": want >= 0"));
  if (split == data::Split::kVal && training.val_interval_steps() <= 0) {
    return absl::FailedPreconditionError(
        "the job has no validation (training.val_interval_steps is 0)");
  }
  // The options and calls of the worker's OpenData, StepLoop and MaybeValidate.
  const data::TokenDataset::Options options{spec.model().vocab_size(), training.sequence_length(),
                                            training.grad_accum_steps()};
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<data::TokenDataset> dataset,
                        data::TokenDataset::Open(spec.data(), options, split));
  const bool val = split == data::Split::kVal;
  const int micro_steps = val ? training.val_batches() : training.grad_accum_steps();
  const int per_rank = training.micro_batch_size();
  JobBatches out;
  out.seq_len = training.sequence_length();
  out.rows = micro_steps * world * per_rank;
  const size_t cells = static_cast<size_t>(out.rows) * out.seq_len;
  out.inputs.resize(cells);
  out.targets.resize(cells);
  out.doc_starts.resize(cells);
  out.document_masking = spec.data().document_masking();
  out.reset_positions = out.document_masking && spec.data().reset_positions();
  size_t at = 0;
  for (int micro = 0; micro < micro_steps; ++micro) {
    for (int rank = 0; rank < world; ++rank) {
      dataset->Batch(training.seed(), val ? 0 : step, micro, rank, world, per_rank, &out.inputs[at],
                     &out.targets[at], &out.doc_starts[at]);
      at += static_cast<size_t>(per_rank) * out.seq_len;
    }
  }
  return out;
}

nlohmann::json MaskedLossBatchJson(const JobBatches& batches) {
  const auto matrix = [&](const std::vector<int32_t>& cells) {
    nlohmann::json rows = nlohmann::json::array();
    for (int r = 0; r < batches.rows; ++r) {
      const auto row = cells.begin() + static_cast<ptrdiff_t>(r) * batches.seq_len;
      rows.push_back(std::vector<int32_t>(row, row + batches.seq_len));
    }
    return rows;
  };
  nlohmann::json out = {{"inputs", matrix(batches.inputs)}, {"targets", matrix(batches.targets)}};
  // Without document masking the engine attends over the whole row, whatever the flags say
  // about documents: one document a row, which is what masked_loss.py assumes without them.
  if (batches.document_masking) {
    out["doc_starts"] = matrix(batches.doc_starts);
    out["reset_positions"] = batches.reset_positions;
  }
  return out;
}

}  // namespace weft::dataprep
