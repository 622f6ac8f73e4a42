// How a training step's failures are told apart from the ones a restart cures.
//
// Steps skipped because their gradient was not finite (a NaN or an infinity somewhere): every
// engine leaves the weights and optimizer state as they were for such a step
// (engine::GradScaleFor) and reports a non-finite gradient norm. A few in a row are tolerated
// (a rare overflow, one bad batch); more fail the job permanently, with what to do about it,
// rather than train on for hours without learning — a resumed job would replay the same
// batches onto the same weights.
//
// Step errors: a step that returns an error of a deterministic kind fails the same way on any
// machine and after any restart.
#ifndef WEFT_WORKER_STEP_FAILURES_H_
#define WEFT_WORKER_STEP_FAILURES_H_

#include <cstdint>

#include "absl/status/status.h"

namespace weft::worker {

// The current run of skipped steps.
struct SkippedRun {
  int64_t first = -1;  // its first step (0-based), -1 when the last step was not skipped
  int32_t count = 0;
};

// After step `step` (0-based) ended with global gradient norm `grad_norm`: updates `run` and
// returns OK while the run is at most `max_skipped` long (fault.max_skipped_steps), else
// FAILED_PRECONDITION naming the steps, the limit and what to change.
absl::Status AfterStep(int64_t step, double grad_norm, int32_t max_skipped, SkippedRun* run);

// Whether a step's error is deterministic: INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE
// or UNIMPLEMENTED (a kernel or collective refusing its arguments, a shape or path the engine
// does not take). The rank then reports it at once as permanent. Every other code — a peer
// lost (UNAVAILABLE), a timeout, an abort, a device or NCCL failure (INTERNAL), memory — may
// be a symptom of another rank's or machine's trouble: the rank waits for the coordinator's
// verdict first and reports it as retryable.
bool IsDeterministicStepError(const absl::Status& status);

}  // namespace weft::worker

#endif  // WEFT_WORKER_STEP_FAILURES_H_
