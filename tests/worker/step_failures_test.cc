// The skipped-step budget (worker/step_failures.h): runs of non-finite steps, their reset by a
// finite one, the limit, and the message a user acts on.
#include "worker/step_failures.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::worker {
namespace {

using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(SkippedStepsTest, AFiniteStepEndsTheRun) {
  SkippedRun run;
  EXPECT_TRUE(AfterStep(0, 1.5, 2, &run).ok());
  EXPECT_EQ(run.count, 0);
  EXPECT_TRUE(AfterStep(1, kNaN, 2, &run).ok());
  EXPECT_TRUE(AfterStep(2, kInf, 2, &run).ok());
  EXPECT_EQ(run.count, 2);
  EXPECT_EQ(run.first, 1);
  EXPECT_TRUE(AfterStep(3, 0.7, 2, &run).ok());  // recovered: the budget is whole again
  EXPECT_EQ(run.count, 0);
  EXPECT_EQ(run.first, -1);
  EXPECT_TRUE(AfterStep(4, kNaN, 2, &run).ok());
  EXPECT_TRUE(AfterStep(5, kNaN, 2, &run).ok());
}

TEST(SkippedStepsTest, OneMoreThanTheLimitFailsNamingTheSteps) {
  SkippedRun run;
  EXPECT_TRUE(AfterStep(9, kNaN, 2, &run).ok());
  EXPECT_TRUE(AfterStep(10, -kInf, 2, &run).ok());
  const absl::Status s = AfterStep(11, kNaN, 2, &run);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("3 steps in a row (10-12)"));
  EXPECT_THAT(s.message(), HasSubstr("weights are those after step 9"));
  EXPECT_THAT(s.message(), HasSubstr("fault.max_skipped_steps allows 2"));
  EXPECT_THAT(s.message(), HasSubstr("optimizer.learning_rate"));
}

TEST(SkippedStepsTest, ZeroToleratesNone) {
  SkippedRun run;
  const absl::Status s = AfterStep(0, kNaN, 0, &run);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("at step 1;"));
  EXPECT_TRUE(AfterStep(0, 3.0, 0, &run).ok());
}

TEST(StepErrorsTest, OnlyArgumentAndPathErrorsAreDeterministic) {
  for (const absl::Status& s :
       {absl::InvalidArgumentError("flash attention: head size 96 is not supported"),
        absl::FailedPreconditionError("the model is wider than the kernels take"),
        absl::OutOfRangeError("token 70000 outside the vocabulary"),
        absl::UnimplementedError("Gloo ReduceScatter: bfloat16")}) {
    EXPECT_TRUE(IsDeterministicStepError(s)) << s;
  }
  // What another rank's or machine's trouble looks like from here: wait for the verdict.
  for (const absl::Status& s :
       {absl::UnavailableError("connection to rank 3 lost"),
        absl::DeadlineExceededError("NCCL AllGather timed out"),
        absl::AbortedError("the communicator was aborted"),
        absl::InternalError("CUDA: an illegal memory access"),
        absl::ResourceExhaustedError("out of memory"), absl::CancelledError("stopped"),
        absl::UnknownError("?")}) {
    EXPECT_FALSE(IsDeterministicStepError(s)) << s;
  }
}

}  // namespace
}  // namespace weft::worker
