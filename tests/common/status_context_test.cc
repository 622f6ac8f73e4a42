// Unit tests for common/status_context: Annotate and the *_CONTEXT macros.
#include "common/status_context.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace weft {
namespace {

TEST(AnnotateTest, OkStaysOk) {
  EXPECT_TRUE(Annotate(absl::OkStatus(), "anything").ok());
}

TEST(AnnotateTest, PrefixesTheMessageAndKeepsTheCode) {
  const absl::Status s = Annotate(absl::UnavailableError("connection refused"), "checkpointd");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "checkpointd: connection refused");
}

TEST(AnnotateTest, NestsOutermostFirst) {
  const absl::Status s =
      Annotate(Annotate(absl::NotFoundError("no such file"), "/x/tok.model"), "data.tokenizer_path");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "data.tokenizer_path: /x/tok.model: no such file");
}

// The separator is always there: call sites that built "<context>: <message>" by hand read the
// same after moving to Annotate, whatever the message.
TEST(AnnotateTest, EmptySidesKeepTheSeparator) {
  EXPECT_EQ(Annotate(absl::InternalError(""), "step 3").message(), "step 3: ");
  EXPECT_EQ(Annotate(absl::InternalError("boom"), "").message(), ": boom");
}

TEST(AnnotateTest, KeepsPayloads) {
  absl::Status original = absl::AbortedError("generation ended");
  original.SetPayload("type.weft/why", absl::Cord("restart"));
  const absl::Status s = Annotate(original, "rank 1");
  ASSERT_TRUE(s.GetPayload("type.weft/why").has_value());
  EXPECT_EQ(std::string(*s.GetPayload("type.weft/why")), "restart");
}

absl::Status ReturnIfError(const absl::Status& inner, int* context_evaluations) {
  const auto context = [context_evaluations] {
    ++*context_evaluations;
    return std::string("reading the manifest");
  };
  WEFT_RETURN_IF_ERROR_CONTEXT(inner, context());
  return absl::OkStatus();
}

TEST(ReturnIfErrorContextTest, AnnotatesAFailureAndEvaluatesTheContextOnlyThen) {
  int evaluations = 0;
  EXPECT_TRUE(ReturnIfError(absl::OkStatus(), &evaluations).ok());
  EXPECT_EQ(evaluations, 0);
  const absl::Status s = ReturnIfError(absl::DataLossError("crc mismatch"), &evaluations);
  EXPECT_EQ(evaluations, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "reading the manifest: crc mismatch");
}

absl::StatusOr<int> AssignOrReturn(absl::StatusOr<std::unique_ptr<int>> inner,
                                   int* context_evaluations) {
  const auto context = [context_evaluations] {
    ++*context_evaluations;
    return absl::StrCat("step ", 7);
  };
  // A move-only value, as the tokenizers and importers the callers open are.
  WEFT_ASSIGN_OR_RETURN_CONTEXT(std::unique_ptr<int> value, std::move(inner), context());
  return *value + 1;
}

TEST(AssignOrReturnContextTest, AssignsAValueAndAnnotatesAFailure) {
  int evaluations = 0;
  absl::StatusOr<int> ok = AssignOrReturn(std::make_unique<int>(41), &evaluations);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 42);
  EXPECT_EQ(evaluations, 0);
  absl::StatusOr<int> failed = AssignOrReturn(absl::ResourceExhaustedError("oom"), &evaluations);
  EXPECT_EQ(evaluations, 1);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(failed.status().message(), "step 7: oom");
}

}  // namespace
}  // namespace weft
