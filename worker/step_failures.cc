#include "worker/step_failures.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace weft::worker {

absl::Status AfterStep(int64_t step, double grad_norm, int32_t max_skipped, SkippedRun* run) {
  if (std::isfinite(grad_norm)) {
    *run = SkippedRun{};
    return absl::OkStatus();
  }
  if (run->count == 0) run->first = step;
  ++run->count;
  if (run->count <= max_skipped) return absl::OkStatus();
  // Steps are 1-based where users see them (JobStatus.step, trainctl).
  const std::string steps = run->count == 1 ? absl::StrCat("step ", step + 1)
                                            : absl::StrCat(run->count, " steps in a row (",
                                                           run->first + 1, "-", step + 1, ")");
  return absl::FailedPreconditionError(absl::StrCat(
      "the gradient was not finite (NaN or infinity) at ", steps,
      "; each was skipped, so the weights are those after step ", run->first,
      ", but fault.max_skipped_steps allows ", max_skipped,
      " in a row. Lower optimizer.learning_rate or raise lr_schedule.warmup_steps, keep "
      "optimizer.grad_clip_norm on, check the data, or continue from an earlier checkpoint"));
}

bool IsDeterministicStepError(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

}  // namespace weft::worker
